"""The checks of lesson 4.5: a stub is not attempted, the right answer passes, known-wrong answers fail
saying what to fix."""

import json

import numpy as np
import pytest

from course.exercises import check
from course.gpt import GPTConfig

import known_wrong  # tests/known_wrong.py

pytestmark = pytest.mark.part4

CONV1D = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")


# ---- right answers ---------------------------------------------------------------------------

def bytes_to_unicode():
    printable = set(range(ord("!"), ord("~") + 1)) | set(range(ord("¡"), ord("¬") + 1)) | set(range(ord("®"), 256))
    table, n = {}, 0
    for b in range(256):
        if b in printable:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + n)
            n += 1
    return table


def to_course_state(tensors):
    state = {}
    for name, array in tensors.items():
        if not name.startswith("transformer."):
            name = "transformer." + name
        if name.endswith(".attn.bias"):
            continue
        state[name] = array.T if name.endswith(CONV1D) else array
    state["lm_head.weight"] = state["transformer.wte.weight"]
    return state


def config_from_gpt2(d):
    if d.get("activation_function", "gelu_new") not in ("gelu_new", "gelu_pytorch_tanh", "gelu_fast"):
        raise ValueError(f"activation_function {d['activation_function']!r} is not GELU's tanh approximation")
    return GPTConfig(vocab_size=d["vocab_size"], block_size=d["n_positions"], n_layer=d["n_layer"],
                     n_head=d["n_head"], n_embd=d["n_embd"], layer_norm_epsilon=d.get("layer_norm_epsilon", 1e-5),
                     n_inner=d.get("n_inner"), tie_word_embeddings=d.get("tie_word_embeddings", True))


DTYPES = {"F32": np.float32, "F64": np.float64, "I64": np.int64, "F16": np.float16}


def load_tensor(data, name):
    n = int.from_bytes(data[:8], "little")
    info = json.loads(data[8:8 + n])[name]
    start, end = info["data_offsets"]
    return np.frombuffer(data[8 + n + start:8 + n + end], dtype=DTYPES[info["dtype"]]).reshape(info["shape"])


RIGHT = {"4.5.1": bytes_to_unicode, "4.5.2": to_course_state, "4.5.3": config_from_gpt2, "4.5.4": load_tensor}


def stub(*args, **kwargs):
    raise NotImplementedError


@pytest.mark.parametrize("exercise_id", sorted(RIGHT))
def test_stub_is_not_attempted_and_the_solution_passes(exercise_id, capsys):
    assert check(exercise_id, stub).status == "not attempted"
    result = check(exercise_id, RIGHT[exercise_id])
    assert result.status == "passed", result.message


# ---- known-wrong answers ---------------------------------------------------------------------

def every_byte_itself():
    return {b: chr(b) for b in range(256)}


def offset_by_the_byte():  # chr(256 + b) instead of counting the non-printable bytes
    table = bytes_to_unicode()
    return {b: (c if ord(c) < 256 else chr(256 + b)) for b, c in table.items()}


def the_library_table():
    from course.gpt.tokenizer import bytes_to_unicode as library

    return library()


def transposes_every_matrix(tensors):
    state = to_course_state(tensors)
    return {k: (v.T if v.ndim == 2 else v) for k, v in state.items()}


def forgets_square_c_proj(tensors):
    state = to_course_state(tensors)
    for k in state:
        if k.endswith("attn.c_proj.weight"):
            state[k] = state[k].T  # back to the file's (in, out): same shape, wrong values
    return state


def keeps_the_mask_buffer(tensors):
    state = to_course_state(tensors)
    state.update({("transformer." + k).replace("transformer.transformer.", "transformer."): v
                  for k, v in tensors.items() if k.endswith(".attn.bias")})
    return state


def no_lm_head(tensors):
    state = to_course_state(tensors)
    del state["lm_head.weight"]
    return state


def no_prefix(tensors):
    return {k.removeprefix("transformer."): v for k, v in to_course_state(tensors).items()}


def by_the_library_loader(tensors):
    import tempfile

    from course.gpt import GPT

    return dict(GPT.from_pretrained(tempfile.mkdtemp()).state_dict())


def ignores_epsilon(d):
    config = config_from_gpt2(d)
    config.layer_norm_epsilon = 1e-5
    return config


def untied_by_default(d):
    return config_from_gpt2(dict(d, tie_word_embeddings=d.get("tie_word_embeddings", False)))


def accepts_any_activation(d):
    return config_from_gpt2(dict(d, activation_function="gelu_new"))


def silent_error(d):
    if d.get("activation_function", "gelu_new") == "relu":
        raise ValueError("unsupported")
    return config_from_gpt2(d)


def accepts_every_gelu(d):  # the erf GELU let through: a model that computes the tanh form gets it
    if not d.get("activation_function", "gelu_new").startswith("gelu"):
        raise ValueError("activation_function must be a GELU")
    return config_from_gpt2(dict(d, activation_function="gelu_new"))


def asserts_instead(d):
    assert d.get("activation_function", "gelu_new") in ("gelu_new", "gelu_pytorch_tanh", "gelu_fast"), \
        "activation_function is not the tanh GELU"
    return config_from_gpt2(d)


def raises_type_error(d):
    if d.get("activation_function", "gelu_new") not in ("gelu_new", "gelu_pytorch_tanh", "gelu_fast"):
        raise TypeError("activation_function is not the tanh GELU")
    return config_from_gpt2(d)


def refuses_gelu_fast(d):  # gelu_fast is a tanh approximation too
    if d.get("activation_function", "gelu_new") not in ("gelu_new", "gelu_pytorch_tanh"):
        raise ValueError(f"activation_function {d['activation_function']!r} is not supported")
    return config_from_gpt2(d)


def ignores_a_missing_activation(d):  # a file without the key means GPT-2's gelu_new, not an error
    if d.get("activation_function") not in ("gelu_new", "gelu_pytorch_tanh", "gelu_fast"):
        raise ValueError("activation_function is missing or not the tanh GELU")
    return config_from_gpt2(d)


def uses_n_ctx(d):
    return config_from_gpt2(dict(d, n_positions=d.get("n_ctx", 2 * d["n_positions"])))


def by_the_library_config(d):
    from course.gpt.pretrained import config_from_hf

    return config_from_hf(d)


def big_endian_length(data, name):
    n = int.from_bytes(data[:8], "big")
    info = json.loads(data[8:8 + n])[name]
    start, end = info["data_offsets"]
    return np.frombuffer(data[8 + n + start:8 + n + end], dtype=DTYPES[info["dtype"]]).reshape(info["shape"])


def offsets_from_the_start(data, name):
    n = int.from_bytes(data[:8], "little")
    info = json.loads(data[8:8 + n])[name]
    start, end = info["data_offsets"]
    return np.frombuffer(data[start:end], dtype=DTYPES[info["dtype"]]).reshape(info["shape"])


def always_float32(data, name):
    n = int.from_bytes(data[:8], "little")
    info = json.loads(data[8:8 + n])[name]
    start, end = info["data_offsets"]
    return np.frombuffer(data[8 + n + start:8 + n + end], dtype=np.float32).reshape(info["shape"])


def sizes_in_key_order(data, name):  # data_offsets ignored: the tensors laid end to end in the header's order
    n = int.from_bytes(data[:8], "little")
    header = json.loads(data[8:8 + n])
    at = 8 + n
    for key, info in header.items():
        if key == "__metadata__":
            continue
        size = int(np.prod(info["shape"])) * np.dtype(DTYPES[info["dtype"]]).itemsize
        if key == name:
            return np.frombuffer(data[at:at + size], dtype=DTYPES[info["dtype"]]).reshape(info["shape"])
        at += size


def header_without_its_length(data, name):  # the JSON read from byte 8 to its end, the 8 bytes skipped wrongly
    n = int.from_bytes(data[:8], "little")
    info = json.loads(data[8:8 + n])[name]
    start, end = info["data_offsets"]
    return np.frombuffer(data[n + start:n + end], dtype=DTYPES[info["dtype"]]).reshape(info["shape"])


def flat_tensor(data, name):  # the shape forgotten
    n = int.from_bytes(data[:8], "little")
    info = json.loads(data[8:8 + n])[name]
    start, end = info["data_offsets"]
    return np.frombuffer(data[8 + n + start:8 + n + end], dtype=DTYPES[info["dtype"]])


def float16_as_float32(data, name):  # F16 read as a 4-byte float
    table = dict(DTYPES, F16=np.float32)
    n = int.from_bytes(data[:8], "little")
    info = json.loads(data[8:8 + n])[name]
    start, end = info["data_offsets"]
    raw = data[8 + n + start:8 + n + end]
    if info["dtype"] != "F16":
        return np.frombuffer(raw, dtype=table[info["dtype"]]).reshape(info["shape"])
    return np.frombuffer(raw[:len(raw) // 4 * 4], dtype=np.float32)


def by_safetensors(data, name):
    from safetensors.numpy import load

    return load(data)[name]


KNOWN_WRONG = {
    "4.5.1": [(every_byte_itself, ["byte 0 is not printable", "U+0100"]),
              (offset_by_the_byte, ["byte 127 is not printable", "expected 'ġ'"]),
              (the_library_table, ["write this yourself", "course.gpt.tokenizer.bytes_to_unicode"])],
    "4.5.2": [(transposes_every_matrix, ["transformer.wte.weight: expected shape (7, 4)", "not a Conv1D weight"]),
              (forgets_square_c_proj, ["attn.c_proj.weight: wrong values", "transpose it even when it is square"]),
              (keeps_the_mask_buffer, ["the causal mask, a buffer"]),
              (no_lm_head, ["missing ['lm_head.weight']"]),
              (no_prefix, ["missing ['transformer.h.0.attn.c_attn.bias'"]),
              (by_the_library_loader, ["write this yourself", "course.gpt.GPT.from_pretrained"])],
    "4.5.3": [(ignores_epsilon, ["layer_norm_epsilon: expected 0.001, got 1e-05"]),
              (untied_by_default, ["tie_word_embeddings: expected True, got False", "leave out"]),
              (accepts_any_activation, ["expected a ValueError naming activation_function", "'relu'"]),
              (silent_error, ["the error should name the key activation_function"]),
              (accepts_every_gelu, ["expected a ValueError naming activation_function", "'gelu'"]),
              (asserts_instead, ["expected a ValueError naming activation_function", "got AssertionError"]),
              (raises_type_error, ["expected a ValueError", "got TypeError"]),
              (refuses_gelu_fast, ["raised ValueError", "'gelu_fast'"]),
              (ignores_a_missing_activation, ["raised ValueError", "a small config with n_inner"]),
              (uses_n_ctx, ["block_size: expected 24, got 48"]),
              (by_the_library_config, ["write this yourself", "course.gpt.pretrained.config_from_hf"])],
    "4.5.4": [(big_endian_length, ["raised UnicodeDecodeError", "little-endian"]),
              (offsets_from_the_start, ["do the offsets start after the header?"]),
              (always_float32, ["the dtype is written there"]),
              (sizes_in_key_order, ["stored in another order than listed"]),
              (header_without_its_length, ["stored in another order than listed"]),
              (flat_tensor, ["expected shape (5, 3), got (15,)"]),
              (float16_as_float32, ["expected dtype float16 (the header says it), got float32"]),
              (by_safetensors, ["write this yourself", "safetensors.numpy.load"])],
}


@pytest.mark.parametrize("exercise_id,wrong,words", known_wrong.cases(KNOWN_WRONG))
def test_known_wrong_answer_fails_saying_why(exercise_id, wrong, words, capsys):
    known_wrong.assert_fails_saying(exercise_id, wrong, words)


# ---- right answers written otherwise ---------------------------------------------------------

def bytes_to_unicode_by_lists():
    keep = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
    others = [b for b in range(256) if b not in keep]
    return dict(zip(keep + others, [chr(b) for b in keep] + [chr(256 + i) for i in range(len(others))]))


def to_course_state_by_comprehension(tensors):
    full = {k if k.startswith("transformer.") else f"transformer.{k}": v for k, v in tensors.items()}
    state = {k: np.transpose(v) if any(k.endswith(c) for c in CONV1D) else v
             for k, v in full.items() if not k.endswith(".attn.bias")}
    return {**state, "lm_head.weight": state["transformer.wte.weight"]}


def config_by_renaming(d):
    names = {"vocab_size": "vocab_size", "n_positions": "block_size", "n_layer": "n_layer", "n_head": "n_head",
             "n_embd": "n_embd", "layer_norm_epsilon": "layer_norm_epsilon", "n_inner": "n_inner",
             "tie_word_embeddings": "tie_word_embeddings"}
    act = d.get("activation_function", "gelu_new")
    if act not in {"gelu_new", "gelu_pytorch_tanh", "gelu_fast"}:
        raise ValueError(f"activation_function {act} is not supported")
    defaults = {"layer_norm_epsilon": 1e-5, "n_inner": None, "tie_word_embeddings": True}
    return GPTConfig(**{ours: d.get(theirs, defaults.get(theirs)) for theirs, ours in names.items()})


def to_course_state_emptying_the_dict(tensors):  # right: the dict is emptied, its arrays untouched
    state = to_course_state(dict(tensors))
    tensors.clear()
    return state


TANH_FORMS = frozenset({"gelu_new", "gelu_pytorch_tanh", "gelu_fast"})


def config_with_a_guard_clause(d):
    activation = d.get("activation_function") or "gelu_new"
    if activation in TANH_FORMS:
        return GPTConfig(d["vocab_size"], d["n_positions"], d["n_layer"], d["n_head"], d["n_embd"],
                         layer_norm_epsilon=d.get("layer_norm_epsilon", 1e-5), n_inner=d.get("n_inner"),
                         tie_word_embeddings=d.get("tie_word_embeddings", True))
    raise ValueError(f"cannot load activation_function={activation!r}: only the tanh GELU")


def config_by_match(d):  # right: a match statement on the activation
    match d.get("activation_function", "gelu_new"):
        case "gelu_new" | "gelu_pytorch_tanh" | "gelu_fast":
            pass
        case other:
            raise ValueError(f"activation_function {other!r}: only GELU's tanh approximation loads")
    keys = {"block_size": "n_positions", "n_layer": "n_layer", "n_head": "n_head", "n_embd": "n_embd",
            "vocab_size": "vocab_size"}
    return GPTConfig(**{ours: d[theirs] for ours, theirs in keys.items()},
                     layer_norm_epsilon=d.get("layer_norm_epsilon", 1e-5), n_inner=d.get("n_inner"),
                     tie_word_embeddings=d.get("tie_word_embeddings", True))


def load_tensor_with_struct(data, name):
    import struct

    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n].decode("utf-8"))
    dtype = {"F32": "<f4", "F64": "<f8", "I64": "<i8", "F16": "<f2"}[header[name]["dtype"]]
    a, b = header[name]["data_offsets"]
    return np.array(np.frombuffer(data, dtype=dtype, count=(b - a) // np.dtype(dtype).itemsize,
                                  offset=8 + n + a)).reshape(header[name]["shape"])


def load_tensor_by_offset(data, name):  # right: frombuffer's offset and count, dtype from its letters
    n = int.from_bytes(data[:8], "little")
    info = json.loads(data[8:8 + n])[name]
    start, end = info["data_offsets"]
    kind, bits = info["dtype"][0], int(info["dtype"][1:])
    dtype = np.dtype({"F": "f", "I": "i"}[kind] + str(bits // 8)).newbyteorder("<")
    flat = np.frombuffer(data, dtype=dtype, count=(end - start) // dtype.itemsize, offset=8 + n + start)
    return flat.astype(dtype.newbyteorder("=")).reshape(info["shape"])


@pytest.mark.parametrize("exercise_id,candidate", [
    ("4.5.1", bytes_to_unicode_by_lists), ("4.5.4", load_tensor_by_offset), ("4.5.2", to_course_state_by_comprehension),
    ("4.5.2", to_course_state_emptying_the_dict), ("4.5.3", config_by_renaming), ("4.5.3", config_with_a_guard_clause), ("4.5.3", config_by_match), ("4.5.4", load_tensor_with_struct)])
def test_right_answers_written_otherwise_pass(exercise_id, candidate, capsys):
    assert check(exercise_id, candidate).status == "passed", capsys.readouterr().out
