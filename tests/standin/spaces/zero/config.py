"""The stand-in's `spaces.zero.config`: the GPU kind's config as the real `get_config` returns it
(`spaces/zero/configs.json`), its duration factor the stand-in's (`spaces.DURATION_FACTOR`)."""


def get_config() -> dict:
    import spaces

    return {"model": "NVIDIA H200" if spaces.DURATION_FACTOR == 1.0 else "NVIDIA RTX PRO 6000 Blackwell Server Edition",
            "duration_factor": spaces.DURATION_FACTOR}
