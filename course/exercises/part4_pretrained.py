"""Checks of lesson 4.5: GPT-2 in your engine (its byte table, its names and Conv1D weights, its
config, and the safetensors format)."""

import json
import struct

import numpy as np

from ._core import CheckFailed, call, exercise, expect


def _ref_byte_table():
    printable = [*range(33, 127), *range(161, 173), *range(174, 256)]
    table, extra = {}, 0
    for b in range(256):
        if b in printable:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return table


@exercise("4.5.1", hint="the printable bytes ('!'..'~', '¡'..'¬', '®'..'ÿ') stand for themselves; the others "
                        "take the characters from U+0100 on, one after another, in byte order",
          answer_hint="keep a counter n of the non-printable bytes seen so far: byte b -> chr(256 + n), then n += 1",
          forbid=["course.gpt.tokenizer.bytes_to_unicode"], task="build the table yourself")
def _(candidate, rng):
    got = call(candidate, on="bytes_to_unicode()")
    if not isinstance(got, dict):
        raise CheckFailed(f"expected a dict byte -> character, got {type(got).__name__}")
    expected = _ref_byte_table()
    expect(sorted(got) == list(range(256)), f"expected the 256 bytes 0..255 as keys, got {len(got)} keys")
    for b in [ord("!"), ord("A"), ord("~"), 0xA1, 0xFF]:
        expect(got[b] == expected[b], f"byte {b} ({chr(b)!r}) is printable: it should stand for itself, "
                                      f"got {got[b]!r}")
    for b in [0, 1, ord(" "), ord("\n"), 127, 0xA0, 0xAD]:
        expect(got[b] == expected[b], f"byte {b} is not printable: expected {expected[b]!r} "
                                      f"(U+{ord(expected[b]):04X}), got {got[b]!r}")
    expect(len(set(got.values())) == 256, "two bytes share a character: the table must be one to one")
    wrong = [b for b in range(256) if got[b] != expected[b]]
    expect(not wrong, f"byte {wrong[0] if wrong else 0}: expected {expected[wrong[0]]!r}, got {got[wrong[0]]!r}"
           if wrong else "")


_CONV1D = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")


def _gpt2_file(rng, n_layer=2, C=4, V=7, T=5, prefix="", buffers=True):
    """A small GPT-2 file's tensors, by GPT-2's names (Conv1D weights (in, out))."""
    t = {f"{prefix}wte.weight": rng.normal(size=(V, C)), f"{prefix}wpe.weight": rng.normal(size=(T, C)),
         f"{prefix}ln_f.weight": rng.normal(size=C), f"{prefix}ln_f.bias": rng.normal(size=C)}
    for i in range(n_layer):
        h = f"{prefix}h.{i}."
        for ln in ("ln_1", "ln_2"):
            t[h + ln + ".weight"], t[h + ln + ".bias"] = rng.normal(size=C), rng.normal(size=C)
        for name, (i_, o_) in {"attn.c_attn": (C, 3 * C), "attn.c_proj": (C, C),
                               "mlp.c_fc": (C, 4 * C), "mlp.c_proj": (4 * C, C)}.items():
            t[h + name + ".weight"], t[h + name + ".bias"] = rng.normal(size=(i_, o_)), rng.normal(size=o_)
        if buffers:
            t[h + "attn.bias"] = np.tril(np.ones((1, 1, T, T)))
    return t


def _ref_course_state(tensors):
    out = {}
    for name, a in tensors.items():
        course = name if name.startswith("transformer.") else "transformer." + name
        if course.endswith((".attn.bias", ".attn.masked_bias")):
            continue
        out[course] = a.T if course.endswith(_CONV1D) else a
    out["lm_head.weight"] = out["transformer.wte.weight"]
    return out


@exercise("4.5.2", hint="the course's names start with `transformer.`; only the four Conv1D weights of each block "
                        "are stored (in, out), and the causal-mask buffers are not weights; GPT-2's head is its "
                        "token embedding",
          answer_hint="for each name: add 'transformer.' when it is missing, skip names ending in '.attn.bias', "
                      "transpose (.T) the names ending in one of _CONV1D's four; then lm_head.weight = the wte array",
          forbid=["course.gpt.pretrained.load_gpt2", "course.gpt.GPT.from_pretrained"],
          task="rename and transpose the tensors yourself")
def _(candidate, rng):
    for prefix, buffers, on in [("", True, "the hub's gpt2 names (h.0.attn.c_attn.weight, ..., with attn.bias buffers)"),
                                ("transformer.", False, "names with the transformer. prefix (as GPT2LMHeadModel saves)")]:
        tensors = _gpt2_file(rng, prefix=prefix, buffers=buffers)
        given = {k: v.copy() for k, v in tensors.items()}
        arrays = dict(given)  # the dict is the learner's to empty; its arrays are not
        got = call(candidate, given, on=on)
        if not isinstance(got, dict):
            raise CheckFailed(f"expected a dict name -> array, got {type(got).__name__} on {on}")
        expected = _ref_course_state(tensors)
        extra = sorted(set(got) - set(expected))
        missing = sorted(set(expected) - set(got))
        expect(not [k for k in extra if k.endswith(".attn.bias")],
               f"{[k for k in extra if k.endswith('.attn.bias')][:1]} is the causal mask, a buffer, not a weight: "
               f"leave it out, on {on}")
        expect(not missing, f"missing {missing[:3]} on {on}")
        expect(not extra, f"unexpected names {extra[:3]} on {on}")
        for name in expected:
            a = np.asarray(got[name])
            if a.shape != expected[name].shape:
                what = ("a Conv1D weight, stored (in, out): transpose it" if name.endswith(_CONV1D) else
                        "not a Conv1D weight: keep it as it is")
                raise CheckFailed(f"{name}: expected shape {expected[name].shape}, got {a.shape} ({what}) on {on}")
            if not np.allclose(a, expected[name]):
                what = ("a Conv1D weight: transpose it even when it is square" if name.endswith(_CONV1D) else
                        "should be the file's array unchanged")
                raise CheckFailed(f"{name}: wrong values ({what}) on {on}")
        for k, v in tensors.items():
            expect(np.array_equal(arrays[k], v), f"the input {k} was changed: leave the file's tensors as they are")


def _ref_config(d):
    from course.gpt import GPTConfig

    if d.get("activation_function", "gelu_new") not in ("gelu_new", "gelu_pytorch_tanh", "gelu_fast"):
        raise ValueError("activation_function")
    return GPTConfig(vocab_size=d["vocab_size"], block_size=d["n_positions"], n_layer=d["n_layer"],
                     n_head=d["n_head"], n_embd=d["n_embd"], layer_norm_epsilon=d.get("layer_norm_epsilon", 1e-5),
                     n_inner=d.get("n_inner"), tie_word_embeddings=d.get("tie_word_embeddings", True))


@exercise("4.5.3", hint="GPT-2 calls block_size n_positions; keys a file may leave out take GPT-2's defaults "
                        "(layer_norm_epsilon 1e-5, n_inner None, tied embeddings); a GELU that is not the tanh "
                        "approximation cannot be represented",
          answer_hint="GPTConfig(vocab_size=d['vocab_size'], block_size=d['n_positions'], n_layer=..., n_head=..., "
                      "n_embd=..., layer_norm_epsilon=d.get('layer_norm_epsilon', 1e-5), n_inner=d.get('n_inner'), "
                      "tie_word_embeddings=d.get('tie_word_embeddings', True)); raise ValueError naming "
                      "activation_function otherwise",
          forbid=["course.gpt.pretrained.config_from_hf"], task="map the keys yourself")
def _(candidate, rng):
    from course.gpt import GPTConfig

    gpt2 = {"vocab_size": 50257, "n_positions": 1024, "n_ctx": 1024, "n_embd": 768, "n_layer": 12, "n_head": 12,
            "activation_function": "gelu_new", "layer_norm_epsilon": 1e-5, "model_type": "gpt2"}
    cases = [(gpt2, "GPT-2 small's config.json"),
             ({"vocab_size": 61, "n_positions": 24, "n_embd": 32, "n_layer": 3, "n_head": 4, "n_inner": 48,
               "layer_norm_epsilon": 1e-3, "tie_word_embeddings": False}, "a small config with n_inner, eps 1e-3, untied"),
             ({"vocab_size": 10, "n_positions": 7, "n_embd": 8, "n_layer": 1, "n_head": 2,
               "activation_function": "gelu_pytorch_tanh"}, "a config that leaves out eps, n_inner and tying"),
             (dict(gpt2, activation_function="gelu_fast"), "GPT-2's config with activation_function 'gelu_fast'")]
    for d, on in cases:
        got = call(candidate, json.loads(json.dumps(d)), on=on)
        if not isinstance(got, GPTConfig):
            raise CheckFailed(f"expected a GPTConfig, got {type(got).__name__} on {on}")
        expected = _ref_config(d)
        for field in ("vocab_size", "block_size", "n_layer", "n_head", "n_embd", "layer_norm_epsilon", "n_inner",
                      "tie_word_embeddings"):
            expect(getattr(got, field) == getattr(expected, field),
                   f"{field}: expected {getattr(expected, field)!r}, got {getattr(got, field)!r} on {on}")
    # Any other activation is refused, with a ValueError: the erf GELU ("gelu", "gelu_python") differs
    # from the tanh form by up to about 1e-3, a silent mismatch a model built with it would carry.
    for activation in ("relu", "gelu", "gelu_python", "quick_gelu", "silu"):
        bad = dict(gpt2, activation_function=activation)
        on = f"a config with activation_function {activation!r}"
        try:
            candidate(bad)
        except NotImplementedError:
            raise
        except ValueError as e:
            expect("activation_function" in str(e),
                   f"the error should name the key activation_function, got {e!r} on {on}")
        except Exception as e:  # noqa: BLE001 - the wrong kind of error
            raise CheckFailed(f"expected a ValueError naming activation_function on {on}, got "
                              f"{type(e).__name__}: {e}") from None
        else:
            raise CheckFailed(f"expected a ValueError naming activation_function on {on}: the course's GELU is "
                              f"the tanh approximation, so a model built with another would compute something else")


def _safetensors_bytes(tensors, metadata=None, data_order=None):
    """A safetensors file of `tensors`; their bytes in `data_order` (names), which need not be the
    order of the header's keys: only data_offsets say where each one lies."""
    header, offset, body = {}, 0, b""
    if metadata:
        header["__metadata__"] = metadata
    header.update({name: None for name in tensors})
    for name in data_order or list(tensors):
        a = tensors[name]
        raw = np.ascontiguousarray(a).tobytes()
        header[name] = {"dtype": {"float32": "F32", "float64": "F64", "int64": "I64", "float16": "F16"}[a.dtype.name],
                        "shape": list(a.shape), "data_offsets": [offset, offset + len(raw)]}
        offset += len(raw)
        body += raw
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + body


@exercise("4.5.4", hint="8 bytes give the header's length (little-endian); the header is JSON; data_offsets count "
                        "from the end of the header, not from the start of the file; the dtype is written there",
          answer_hint="n = int.from_bytes(data[:8], 'little'); header = json.loads(data[8:8 + n]); start, end = "
                      "header[name]['data_offsets']; np.frombuffer(data[8 + n + start:8 + n + end], dtype="
                      "{'F32': np.float32, 'F64': np.float64, 'I64': np.int64, 'F16': np.float16}[...]).reshape(shape)",
          forbid=["safetensors.numpy.load", "safetensors.numpy.load_file", "safetensors.safe_open",
                  "course.pretrained.read_safetensors"], task="read the bytes yourself")
def _(candidate, rng):
    tensors = {"wte.weight": rng.normal(size=(5, 3)).astype(np.float32),
               "h.0.attn.c_attn.weight": rng.normal(size=(3, 9)).astype(np.float64),
               "steps": np.arange(4, dtype=np.int64), "half": rng.normal(size=(2, 2)).astype(np.float16)}
    # The bytes in another order than the header's keys: only data_offsets say where a tensor lies.
    data = _safetensors_bytes(tensors, metadata={"format": "pt"},
                              data_order=["half", "steps", "h.0.attn.c_attn.weight", "wte.weight"])
    for name in ["wte.weight", "h.0.attn.c_attn.weight", "steps", "half"]:
        on = f"the tensor {name!r} of a file holding {len(tensors)} tensors (stored in another order than listed)"
        got = call(candidate, data, name, on=on)
        if not isinstance(got, np.ndarray):
            raise CheckFailed(f"expected a NumPy array, got {type(got).__name__} on {on}")
        want = tensors[name]
        expect(got.dtype == want.dtype, f"expected dtype {want.dtype} (the header says it), got {got.dtype} on {on}")
        expect(got.shape == want.shape, f"expected shape {want.shape}, got {got.shape} on {on}")
        expect(np.array_equal(got, want), f"the values differ on {on}: do the offsets start after the header?")
