"""Where released weights come from, and the two files they come in (lessons 4.5 and 5.5).

    folder = resolve("gpt2", ["config.json", "model.safetensors"])   # a folder, or a hub name
    config = read_config(folder / "config.json")                       # a dict
    tensors = read_safetensors(folder / "model.safetensors")           # name -> NumPy array
    write_safetensors(path, tensors); write_config(path, config)

A released checkpoint is a folder: `config.json` says how big the model is, `model.safetensors`
holds every weight by name (a small JSON header of names, dtypes, shapes and byte offsets, then
the raw bytes). The `safetensors` package reads it straight into NumPy arrays: no pickle, so a
checkpoint cannot run code when it is opened.

A folder on disk always works, offline. A name such as "gpt2" or "state-spaces/mamba-130m-hf"
is downloaded from the Hugging Face Hub with `huggingface_hub` (the optional `pretrained` extra)
into its cache, only when asked; nothing here touches the network on import.

This module imports no part of the course: `course.gpt` and `course.mamba` both use it.
"""

import json
import os
import re
from pathlib import Path

import numpy as np

__all__ = ["CheckpointError", "resolve", "read_config", "write_config", "read_safetensors", "write_safetensors",
           "is_hub_name"]

INSTALL_HINT = 'pip install "course[pretrained]"  (or: pip install huggingface_hub)'


class CheckpointError(ValueError):
    """A checkpoint that cannot be found, read or represented; the message names the file and the problem."""


_HUB_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)?$")


def is_hub_name(source):
    """Whether `source` reads as a hub repository id ("gpt2", "owner/name") rather than a path."""
    s = str(source)
    return bool(_HUB_NAME.match(s)) and not s.startswith(".") and not s.endswith((".json", ".safetensors"))


def resolve(source, files, optional=()):
    """The local folder holding `files` for `source`: the folder itself, or a hub download.

    `files` must all be there; `optional` ones are fetched too when the hub has them.
    """
    path = Path(os.path.expanduser(str(source)))
    if path.is_dir():
        return path
    if path.exists():
        raise CheckpointError(f"{path} is a file, but a checkpoint is a folder: pass the folder that holds "
                              f"{' and '.join(files)}")
    if not is_hub_name(source):
        raise CheckpointError(f"{path}: no such folder (a checkpoint is a folder holding {' and '.join(files)})")
    return _download(str(source), files, optional)


def _download(name, files, optional):
    try:
        from huggingface_hub import snapshot_download
    except ImportError:
        raise CheckpointError(
            f"{name!r} is not a folder here, and downloading it from the Hugging Face Hub needs huggingface_hub, "
            f"which is not installed: {INSTALL_HINT}; or pass the path of a folder holding "
            f"{' and '.join(files)}") from None
    try:
        folder = Path(snapshot_download(name, allow_patterns=list(files) + list(optional), etag_timeout=5))
    except Exception as e:  # offline, unknown repository, gated model...: one message for all
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise CheckpointError(
            f"{name!r} is not a folder here, and could not download {name!r} from the Hugging Face Hub "
            f"({type(e).__name__}: {first}). "
            f"Is the machine online and the name right? Offline, pass the path of a folder holding "
            f"{' and '.join(files)}") from None
    missing = [f for f in files if not (folder / f).is_file()]
    if missing:
        raise CheckpointError(f"the hub repository {name!r} has no {', '.join(missing)}: this loader reads "
                              f"{' and '.join(files)}")
    return folder


def read_config(path):
    """config.json as a dict; a missing or unreadable file is an error naming it."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{path}: file not found (a checkpoint folder needs its config.json)")
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CheckpointError(f"{path}: not a JSON file ({e})") from None
    if not isinstance(config, dict):
        raise CheckpointError(f"{path}: expected a JSON object of settings, got {type(config).__name__}")
    return config


def write_config(path, config):
    Path(path).write_text(json.dumps(config, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def read_safetensors(path):
    """Every tensor of a .safetensors file, by name, as NumPy arrays (through the safetensors package)."""
    from safetensors import SafetensorError
    from safetensors.numpy import load_file

    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{path}: file not found (the weights of a checkpoint are in model.safetensors; "
                              f"files in PyTorch's pickle format, pytorch_model.bin, are not read here)")
    try:
        return load_file(str(path))
    except (SafetensorError, OSError, ValueError, TypeError) as e:
        size = path.stat().st_size
        raise CheckpointError(f"{path}: not a readable safetensors file ({size} bytes; truncated or another "
                              f"format?): {e}") from None


def write_safetensors(path, tensors, metadata=None):
    """Write name -> array as a .safetensors file (contiguous copies: the format stores raw bytes)."""
    from safetensors.numpy import save_file

    save_file({k: np.ascontiguousarray(v) for k, v in tensors.items()}, str(path),
              metadata={"format": "pt", **(metadata or {})})
