"""The Generate tab's method settings: one control a method's setting, starting at what the methods run with
on this device (`specdemo.defaults`). Layout only, as `specdemo.app.ui`'s builders; a control that
two methods share (lookahead's and the CLLM's n-gram size and candidates) starts at the value both run with."""

import functools

import gradio as gr

from specdemo.defaults import Defaults, default_of

SETTING_WIDTH = 220  # a setting's least width: the settings wrap onto more rows rather than squash their labels


def method_settings(defaults: Defaults) -> dict[str, gr.components.Component]:
    """The method settings accordion: each method's settings (`handlers.KNOBS`) by name, starting
    at what the methods run with on this device (`defaults`), which it names."""
    own = functools.partial(default_of, defaults)
    with gr.Accordion("Method settings", open=False, elem_id="method-settings"):
        gr.Markdown(f"The defaults of this device: the {defaults.name} set ({defaults.chosen}).",
                    elem_id="defaults-set")
        # a column a method, each wide enough for its labels: the columns wrap onto rows rather than squash them
        with gr.Row():
            with gr.Column(min_width=SETTING_WIDTH):
                speculative = dict(
                    gamma=gr.Slider(1, 16, value=own("speculative", "gamma"), step=1,
                                    label="speculative: γ (draft tokens per step)"),
                    adaptive_gamma=gr.Checkbox(False, label="speculative: adaptive γ"),
                    draft_tree_size=gr.Checkbox(True, label="speculative: draft a tree, γ deep, when greedy (EAGLE-2); "
                                                "sampling always drafts a chain"),
                    copy_length=gr.Checkbox(True, label="speculative, medusa: add to the tree the tokens that followed "
                                            "the text's last tokens before (prompt lookup)"),
                    retrieve=gr.Checkbox(True, label="speculative, medusa, lookahead, cllm: also guess what the "
                                         "model's earlier answers wrote after the same words (REST: a datastore of its "
                                         "own answers)"))
            with gr.Column(min_width=SETTING_WIDTH):
                medusa = dict(
                    tree=gr.Dropdown(["dynamic", "static", "chain"], value="dynamic",
                                     label="medusa: tree (dynamic: each pass, the paths the heads are surest of; "
                                     "static: the paths most often right on held-out answers; chain: top-1 only)"),
                    tree_size=gr.Slider(0, 64, value=0, step=1, label="medusa: the heads' tree nodes (0: "
                                        + (f"{size} on this device)" if (size := own("medusa", "tree_size"))
                                           else "the heads' own, 8 for ours)")),
                    typical_acceptance=gr.Checkbox(False, label="medusa: typical acceptance, to sample (Cai et al. "
                                                   "2024; NOT distribution-preserving: the answer is not a sample of "
                                                   "the target)"))
            with gr.Column(min_width=SETTING_WIDTH):
                jacobi_lookahead = dict(
                    decoder=gr.Radio(["lookahead", "jacobi"], value="lookahead", elem_id="decoder",
                                     label="cllm: decode by (lookahead: the fastest here; jacobi: the paper's way, "
                                     "drawn as a trajectory)"),
                    block_size=gr.Slider(1, 64, value=own("jacobi", "block_size"), step=1,
                                         label="jacobi, cllm by jacobi: block size n"),
                    window=gr.Slider(0, 16, value=0, step=1,
                                     label=f"lookahead, cllm by lookahead: window W (0: the method's own, "
                                     f"{own('lookahead', 'window')} for lookahead, {own('cllm', 'window')} for cllm)"),
                    ngram=gr.Slider(2, 8, value=own("lookahead", "ngram"), step=1,
                                    label="lookahead, cllm by lookahead: n-gram size N"),
                    candidates=gr.Slider(0, 16, value=own("lookahead", "candidates"), step=1,
                                         label="lookahead, cllm by lookahead: candidates G"))
            with gr.Column(min_width=SETTING_WIDTH):
                beam_contrastive = dict(
                    num_beams=gr.Slider(1, 8, value=4, step=1, label="beam: beams k"),
                    length_penalty=gr.Slider(-1.0, 3.0, value=1.0, step=0.1,
                                             label="beam: length penalty (score = log p / length^penalty)"),
                    early_stopping=gr.Checkbox(False, label="beam: early stopping (stop once k answers are finished)"),
                    alpha=gr.Slider(0.01, 1.0, value=0.1, step=0.01, label="contrastive: plausibility α"),
                    amateur_temperature=gr.Slider(0.1, 2.0, value=0.5, step=0.1,
                                                  label="contrastive: amateur temperature τ"))
    return {**speculative, **medusa, **jacobi_lookahead, **beam_contrastive}
