"""`--model org/name`: a Hugging Face Hub model id resolved to a local snapshot directory
through huggingface_hub's cache, as transformers and vLLM resolve one.

    resolve("path/that/exists")   the path, as it is
    resolve("org/name")           the cached snapshot of org/name (HF_HUB_CACHE, default
                                  ~/.cache/huggingface/hub: models--org--name/snapshots/REV,
                                  REV from refs/main), else downloaded into that cache where
                                  the network allows (not with HF_HUB_OFFLINE=1)

Only the files a model directory needs are fetched (`PATTERNS`: config, safetensors weights
and index, tokenizer, generation config, exit heads), not a repository's other formats (a
GGUF file is passed as `--model FILE.gguf`). Nothing found is a ValueError naming the id
and the cache.
"""

from __future__ import annotations

import re
from pathlib import Path

# What a model directory needs (`hf_io`): weights in safetensors only, never pickles.
PATTERNS = ["config.json", "generation_config.json", "*.safetensors",
            "model.safetensors.index.json", "tokenizer.json", "tokenizer_config.json",
            "tokenizer.model", "special_tokens_map.json", "chat_template.jinja",
            "recommended_plan.json"]

# org/name as the Hub spells repository ids (one slash; no leading '.', '/', '~').
_REPO_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9_.-]+")


def is_repo_id(text: str) -> bool:
    """Whether `text` reads as a Hub model id (and is no local path: callers ask after
    checking that the path does not exist)."""
    return bool(_REPO_ID.fullmatch(text)) and not text.lower().endswith(".gguf")


def resolve(model: str) -> str:
    """A local path for `--model`: the path itself when it exists or is no Hub id, else the
    Hub model's snapshot directory (from the cache, else downloaded where allowed). Raises
    ValueError naming `model` and the cache when there is none."""
    if Path(model).exists() or not is_repo_id(model):
        return model
    import huggingface_hub
    from huggingface_hub import constants, errors

    try:
        path = huggingface_hub.snapshot_download(model, allow_patterns=PATTERNS,
                                                 local_files_only=True)
    except (errors.LocalEntryNotFoundError, errors.HFValidationError):
        if constants.HF_HUB_OFFLINE:
            raise ValueError(f"--model {model}: not a local path, and not in the Hugging Face "
                             f"cache ({constants.HF_HUB_CACHE}; HF_HUB_OFFLINE=1, so nothing "
                             "is downloaded)") from None
        try:
            path = huggingface_hub.snapshot_download(model, allow_patterns=PATTERNS)
        except Exception as e:  # offline, no such repository, gated, ...: one line
            reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise ValueError(f"--model {model}: not a local path, not in the Hugging Face "
                             f"cache ({constants.HF_HUB_CACHE}), and not downloadable: "
                             f"{reason}") from None
    snapshot = Path(path)
    if not (snapshot / "config.json").is_file():
        raise ValueError(f"--model {model}: the snapshot {snapshot} has no config.json (not a "
                         "Hugging Face model directory; a GGUF-only repository's file is "
                         "passed as --model FILE.gguf)")
    return str(snapshot)
