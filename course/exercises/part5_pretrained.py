"""Checks of lesson 5.5: released Mamba checkpoints (the layouts, the config mapping, the padding)."""

import json

import numpy as np

from ._core import CheckFailed, call, exercise, expect


def _hf_tensors(rng, n_layer=2, d=4, n=3, V=13, r=1, k=4, head=True):
    e = 2 * d
    t = {"backbone.embeddings.weight": rng.normal(size=(V, d)), "backbone.norm_f.weight": rng.normal(size=d)}
    for i in range(n_layer):
        p = f"backbone.layers.{i}."
        t[p + "norm.weight"] = rng.normal(size=d)
        shapes = {"A_log": (e, n), "D": (e,), "in_proj.weight": (2 * e, d), "conv1d.weight": (e, 1, k),
                  "conv1d.bias": (e,), "x_proj.weight": (r + 2 * n, e), "dt_proj.weight": (e, r),
                  "dt_proj.bias": (e,), "out_proj.weight": (d, e)}
        for name, shape in shapes.items():
            t[p + "mixer." + name] = rng.normal(size=shape)
    if head:
        t["lm_head.weight"] = t["backbone.embeddings.weight"]
    return t


def _ref_course_state(tensors, multiple=8):
    out = {}
    for name, a in tensors.items():
        if name == "lm_head.weight":
            continue
        name = name.removeprefix("backbone.")
        out["embedding.weight" if name == "embeddings.weight" else name] = a
    emb = out["embedding.weight"]
    rows = -(-len(emb) // multiple) * multiple
    out["embedding.weight"] = np.concatenate([emb, np.zeros((rows - len(emb), emb.shape[1]))])
    return out


@exercise("5.5.1", hint="the course's names are the file's without `backbone.`, and its embedding is called "
                        "`embedding`; lm_head is the embedding itself (tied); the course's table has its rows "
                        "padded with zeros to a multiple of 8",
          answer_hint="drop lm_head.weight; name.removeprefix('backbone.'); 'embeddings.weight' -> "
                      "'embedding.weight'; np.concatenate([emb, np.zeros((rows - len(emb), d))]) with rows the "
                      "next multiple of 8",
          forbid=["course.mamba.pretrained.load_mamba", "course.mamba.Mamba.from_pretrained"],
          task="rename and pad the tensors yourself")
def _(candidate, rng):
    for V, head, on in [(13, True, "a file with vocab_size 13 and an lm_head.weight"),
                        (16, False, "a file with vocab_size 16 (already a multiple of 8), no lm_head")]:
        tensors = _hf_tensors(rng, V=V, head=head)
        given = {k: v.copy() for k, v in tensors.items()}
        arrays = dict(given)  # the dict is the learner's to empty; its arrays are not
        got = call(candidate, given, on=on)
        if not isinstance(got, dict):
            raise CheckFailed(f"expected a dict name -> array, got {type(got).__name__} on {on}")
        expected = _ref_course_state(tensors)
        expect("lm_head.weight" not in got, f"lm_head.weight is tied to the embedding: leave it out, on {on}")
        missing, extra = sorted(set(expected) - set(got)), sorted(set(got) - set(expected))
        expect(not missing, f"missing {missing[:3]} on {on}")
        expect(not extra, f"unexpected names {extra[:3]} on {on}")
        for name, want in expected.items():
            a = np.asarray(got[name])
            if a.shape != want.shape:
                why = " (pad the rows to a multiple of 8)" if name == "embedding.weight" else ""
                raise CheckFailed(f"{name}: expected shape {want.shape}, got {a.shape}{why} on {on}")
            if not np.allclose(a, want):
                why = (" (the file's rows first, then rows of zeros)" if name == "embedding.weight" else
                       " (the file's array, unchanged)")
                raise CheckFailed(f"{name}: wrong values{why} on {on}")
        for k, v in tensors.items():
            expect(np.array_equal(arrays[k], v), f"the input {k} was changed: leave the file's tensors as they are")


def _ref_config(d):
    from course.mamba import MambaConfig

    if "hidden_size" in d:
        if d.get("use_bias", False):
            raise ValueError("use_bias")
        return MambaConfig(d_model=d["hidden_size"], n_layer=d["num_hidden_layers"], vocab_size=d["vocab_size"],
                           d_state=d.get("state_size", 16), expand=d.get("expand", 2), d_conv=d.get("conv_kernel", 4),
                           dt_rank=d.get("time_step_rank", "auto"))
    ssm = d.get("ssm_cfg") or {}
    return MambaConfig(d_model=d["d_model"], n_layer=d["n_layer"], vocab_size=d["vocab_size"],
                       d_state=ssm.get("d_state", 16), expand=ssm.get("expand", 2), d_conv=ssm.get("d_conv", 4),
                       dt_rank=ssm.get("dt_rank", "auto"))


@exercise("5.5.2", hint="two forms: Hugging Face's (hidden_size, num_hidden_layers, state_size, conv_kernel, "
                        "time_step_rank, expand) and mamba_ssm's (d_model, n_layer, and ssm_cfg holding d_state, "
                        "d_conv, expand, dt_rank); a key a file leaves out keeps MambaConfig's default; "
                        "in_proj/out_proj biases cannot be represented",
          answer_hint="if 'hidden_size' in d: MambaConfig(d_model=d['hidden_size'], n_layer=d['num_hidden_layers'], "
                      "vocab_size=d['vocab_size'], d_state=d.get('state_size', 16), expand=d.get('expand', 2), "
                      "d_conv=d.get('conv_kernel', 4), dt_rank=d.get('time_step_rank', 'auto')); else read d_model, "
                      "n_layer and ssm_cfg.get(...); raise ValueError naming use_bias when it is true",
          forbid=["course.mamba.pretrained.config_from_file"], task="map the keys yourself")
def _(candidate, rng):
    from course.mamba import MambaConfig

    cases = [({"model_type": "mamba", "hidden_size": 768, "num_hidden_layers": 24, "vocab_size": 50280,
               "state_size": 16, "expand": 2, "conv_kernel": 4, "time_step_rank": 48, "use_bias": False},
              "mamba-130m-hf's config.json"),
             ({"hidden_size": 24, "num_hidden_layers": 1, "vocab_size": 37, "state_size": 8, "expand": 3,
               "conv_kernel": 3, "time_step_rank": 5}, "a small Hugging Face config (time_step_rank 5, not auto)"),
             ({"hidden_size": 32, "num_hidden_layers": 2, "vocab_size": 20}, "a Hugging Face config with the defaults"),
             ({"hidden_size": 40, "num_hidden_layers": 1, "vocab_size": 9},
              "a Hugging Face config of hidden_size 40 without time_step_rank (40 / 16 is not whole)"),
             ({"d_model": 768, "n_layer": 24, "vocab_size": 50277, "ssm_cfg": {}, "rms_norm": True,
               "pad_vocab_size_multiple": 8}, "mamba-130m's original config.json (ssm_cfg empty)"),
             ({"d_model": 16, "n_layer": 3, "vocab_size": 11, "ssm_cfg": {"d_state": 4, "d_conv": 2, "expand": 1,
                                                                          "dt_rank": 3}},
              "an original config whose ssm_cfg sets d_state 4, d_conv 2, expand 1, dt_rank 3")]
    for d, on in cases:
        got = call(candidate, json.loads(json.dumps(d)), on=on)
        if not isinstance(got, MambaConfig):
            raise CheckFailed(f"expected a MambaConfig, got {type(got).__name__} on {on}")
        expected = _ref_config(d)
        for field in ("d_model", "n_layer", "vocab_size", "d_state", "expand", "d_conv", "dt_rank"):
            expect(getattr(got, field) == getattr(expected, field),
                   f"{field}: expected {getattr(expected, field)!r}, got {getattr(got, field)!r} on {on}")
    on = "a Hugging Face config with use_bias true"
    try:
        candidate({"hidden_size": 16, "num_hidden_layers": 1, "vocab_size": 8, "use_bias": True})
    except NotImplementedError:
        raise
    except ValueError as e:
        expect("use_bias" in str(e), f"the error should name the key use_bias, got {e!r} on {on}")
    except Exception as e:  # noqa: BLE001 - the wrong kind of error
        raise CheckFailed(f"expected a ValueError naming use_bias on {on}, got {type(e).__name__}: {e}") from None
    else:
        raise CheckFailed(f"expected a ValueError naming use_bias on {on}: the course's Mamba has no biases on "
                          f"in_proj and out_proj, so loading would drop them and compute something else")


@exercise("5.5.3", hint="the way back: put `backbone.` in front, call the embedding `embeddings`, and keep only "
                        "the vocab_size real rows of it (transformers' model has no padding); the tied lm_head is "
                        "not written",
          answer_hint="{'backbone.embeddings.weight': state['embedding.weight'][:vocab_size], and "
                      "'backbone.' + name for every other name except lm_head.weight}",
          forbid=["course.mamba.pretrained.save_mamba", "course.mamba.Mamba.save_pretrained"],
          task="rename and cut the tensors yourself")
def _(candidate, rng):
    for V in (13, 16):
        tensors = _hf_tensors(rng, V=V, head=False)
        state = _ref_course_state(tensors)
        state["lm_head.weight"] = state["embedding.weight"]
        on = f"the course's state_dict of a model with vocab_size {V} ({len(state['embedding.weight'])} rows)"
        given = {k: v.copy() for k, v in state.items()}
        arrays = dict(given)  # the dict is the learner's to empty; its arrays are not
        got = call(candidate, given, V, on=on)
        if not isinstance(got, dict):
            raise CheckFailed(f"expected a dict name -> array, got {type(got).__name__} on {on}")
        expect("lm_head.weight" not in got, f"lm_head.weight is tied: transformers ties it again, leave it out, on {on}")
        missing, extra = sorted(set(tensors) - set(got)), sorted(set(got) - set(tensors))
        expect(not missing, f"missing {missing[:3]} on {on}")
        expect(not extra, f"unexpected names {extra[:3]} on {on}")
        for name, want in tensors.items():
            a = np.asarray(got[name])
            if a.shape != want.shape:
                why = " (only the vocab_size real rows)" if "embeddings" in name else ""
                raise CheckFailed(f"{name}: expected shape {want.shape}, got {a.shape}{why} on {on}")
            expect(np.allclose(a, want), f"{name}: wrong values on {on}")
        for k, v in state.items():
            expect(np.array_equal(arrays[k], v), f"the input {k} was changed: leave the state_dict as it is")
