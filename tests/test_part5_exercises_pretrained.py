"""The checks of lesson 5.5: a stub is not attempted, the right answer passes, known-wrong answers fail
saying what to fix."""

import numpy as np
import pytest

from course.exercises import check
from course.mamba import MambaConfig

import known_wrong  # tests/known_wrong.py

pytestmark = pytest.mark.part5


# ---- right answers ---------------------------------------------------------------------------

def to_course_state(tensors, multiple=8):
    state = {}
    for name, array in tensors.items():
        if name == "lm_head.weight":
            continue
        name = name.removeprefix("backbone.")
        state["embedding.weight" if name == "embeddings.weight" else name] = array
    emb = state["embedding.weight"]
    rows = -(-len(emb) // multiple) * multiple
    state["embedding.weight"] = np.concatenate([emb, np.zeros((rows - len(emb), emb.shape[1]), emb.dtype)])
    return state


def mamba_config(d):
    if d.get("use_bias", False):
        raise ValueError("use_bias=True: the course's Mamba has no bias on in_proj and out_proj")
    if "hidden_size" in d:
        return MambaConfig(d_model=d["hidden_size"], n_layer=d["num_hidden_layers"], vocab_size=d["vocab_size"],
                           d_state=d.get("state_size", 16), expand=d.get("expand", 2), d_conv=d.get("conv_kernel", 4),
                           dt_rank=d.get("time_step_rank", "auto"))
    ssm = d.get("ssm_cfg") or {}
    return MambaConfig(d_model=d["d_model"], n_layer=d["n_layer"], vocab_size=d["vocab_size"],
                       d_state=ssm.get("d_state", 16), expand=ssm.get("expand", 2), d_conv=ssm.get("d_conv", 4),
                       dt_rank=ssm.get("dt_rank", "auto"))


def to_hf_tensors(state, vocab_size):
    out = {}
    for name, array in state.items():
        if name == "lm_head.weight":
            continue
        if name == "embedding.weight":
            out["backbone.embeddings.weight"] = array[:vocab_size]
        else:
            out["backbone." + name] = array
    return out


RIGHT = {"5.5.1": to_course_state, "5.5.2": mamba_config, "5.5.3": to_hf_tensors}


def popping(answer):
    """A right answer that takes the tensors out of the dict it is given as it goes."""
    def taking(tensors, *args):
        result = answer(dict(tensors), *args)
        for name in list(tensors):
            tensors.pop(name)
        return result
    return taking


def rounds_the_rank_down(d):  # d_model // 16, where "auto" is the ceiling
    if "hidden_size" in d and "time_step_rank" not in d:
        d = dict(d, time_step_rank=d["hidden_size"] // 16)
    return mamba_config(d)


def asserts_no_bias(d):
    assert not d.get("use_bias"), "use_bias is not supported"
    return mamba_config(dict(d, use_bias=False))


def raises_key_error(d):
    if d.get("use_bias"):
        raise KeyError("use_bias")
    return mamba_config(d)


def rank_from_the_state_size(d):  # the rank confused with another size
    if "hidden_size" in d:
        d = dict(d, time_step_rank=d.get("state_size", 16) // 16)
    return mamba_config(d)


def expand_fixed_at_two(d):
    return mamba_config(dict(d, expand=2) if "hidden_size" in d else d)


def mamba_config_one_path(d):  # right: both layouts read into one table of MambaConfig's names first
    import math as _math

    from course.mamba import MambaConfig

    if d.get("use_bias", False):
        raise ValueError("use_bias: biases on in_proj and out_proj cannot be loaded")
    ssm = d.get("ssm_cfg") or {}
    fields = {"d_model": d.get("hidden_size", d.get("d_model")), "n_layer": d.get("num_hidden_layers", d.get("n_layer")),
              "vocab_size": d["vocab_size"], "d_state": d.get("state_size", ssm.get("d_state", 16)),
              "expand": d.get("expand", ssm.get("expand", 2)), "d_conv": d.get("conv_kernel", ssm.get("d_conv", 4)),
              "dt_rank": d.get("time_step_rank", ssm.get("dt_rank", "auto"))}
    if fields["dt_rank"] == "auto":
        fields["dt_rank"] = _math.ceil(fields["d_model"] / 16)
    return MambaConfig(**fields)


def mamba_config_by_table(d):  # right, written otherwise: one table of names for each layout
    import math as _math

    from course.mamba import MambaConfig

    if d.get("use_bias"):
        raise ValueError("use_bias=True: the course's Mamba has no in_proj/out_proj biases")
    if "hidden_size" in d:
        get = d.get
        rank = get("time_step_rank") or _math.ceil(d["hidden_size"] / 16)
        return MambaConfig(d_model=d["hidden_size"], n_layer=d["num_hidden_layers"], vocab_size=d["vocab_size"],
                           d_state=get("state_size", 16), expand=get("expand", 2), d_conv=get("conv_kernel", 4),
                           dt_rank=rank)
    ssm = d.get("ssm_cfg") or {}
    return MambaConfig(d_model=d["d_model"], n_layer=d["n_layer"], vocab_size=d["vocab_size"],
                       d_state=ssm.get("d_state", 16), expand=ssm.get("expand", 2), d_conv=ssm.get("d_conv", 4),
                       dt_rank=ssm.get("dt_rank", "auto"))


def stub(*args, **kwargs):
    raise NotImplementedError


@pytest.mark.parametrize("exercise_id", sorted(RIGHT))
def test_stub_is_not_attempted_and_the_solution_passes(exercise_id, capsys):
    assert check(exercise_id, stub).status == "not attempted"
    result = check(exercise_id, RIGHT[exercise_id])
    assert result.status == "passed", result.message


# ---- known-wrong answers ---------------------------------------------------------------------

def no_padding(tensors):
    return to_course_state(tensors, multiple=1)


def keeps_embeddings_name(tensors):
    state = to_course_state(tensors)
    state["embeddings.weight"] = state.pop("embedding.weight")
    return state


def keeps_lm_head(tensors):
    state = to_course_state(tensors)
    state["lm_head.weight"] = state["embedding.weight"]
    return state


def keeps_backbone(tensors):
    return {("backbone." + k): v for k, v in to_course_state(tensors).items()}


def pads_with_random_rows(tensors):
    state = to_course_state(tensors)
    emb = state["embedding.weight"]
    V = len(tensors["backbone.embeddings.weight"])
    state["embedding.weight"] = np.concatenate([emb[:V], np.ones((len(emb) - V, emb.shape[1]))])
    return state


def by_the_library_loader(tensors):
    import tempfile

    from course.mamba import Mamba

    return dict(Mamba.from_pretrained(tempfile.mkdtemp()).state_dict())


def auto_rank(d):
    config = mamba_config(d)
    return MambaConfig(d_model=config.d_model, n_layer=config.n_layer, vocab_size=config.vocab_size,
                       d_state=config.d_state, expand=config.expand, d_conv=config.d_conv)


def ignores_ssm_cfg(d):
    return mamba_config({k: v for k, v in d.items() if k != "ssm_cfg"})


def ignores_conv_kernel(d):
    return mamba_config({k: v for k, v in d.items() if k != "conv_kernel"})


def accepts_biases(d):
    return mamba_config(dict(d, use_bias=False))


def by_the_library_config(d):
    from course.mamba.pretrained import config_from_file

    return config_from_file(d)[0]


def keeps_padding(state, vocab_size):
    return to_hf_tensors(state, len(state["embedding.weight"]))


def writes_lm_head(state, vocab_size):
    out = to_hf_tensors(state, vocab_size)
    out["lm_head.weight"] = out["backbone.embeddings.weight"]
    return out


def original_names(state, vocab_size):
    out = to_hf_tensors(state, vocab_size)
    out["backbone.embedding.weight"] = out.pop("backbone.embeddings.weight")
    return out


def by_the_library_saver(state, vocab_size):
    import tempfile

    from course.mamba import Mamba

    Mamba(MambaConfig(d_model=4, n_layer=1, vocab_size=vocab_size)).save_pretrained(tempfile.mkdtemp())
    return to_hf_tensors(state, vocab_size)


KNOWN_WRONG = {
    "5.5.1": [(no_padding, ["embedding.weight: expected shape (16, 4), got (13, 4) (pad the rows to a multiple of 8)"]),
              (keeps_embeddings_name, ["missing ['embedding.weight']"]),
              (keeps_lm_head, ["lm_head.weight is tied to the embedding: leave it out"]),
              (keeps_backbone, ["missing ['embedding.weight'"]),
              (pads_with_random_rows, ["embedding.weight: wrong values (the file's rows first, then rows of zeros)"]),
              (by_the_library_loader, ["write this yourself", "course.mamba.Mamba.from_pretrained"])],
    "5.5.2": [(auto_rank, ["dt_rank: expected 5, got 2", "time_step_rank 5"]),
              (ignores_ssm_cfg, ["d_state: expected 4, got 16", "ssm_cfg"]),
              (ignores_conv_kernel, ["d_conv: expected 3, got 4"]),
              (accepts_biases, ["expected a ValueError naming use_bias"]),
              (rounds_the_rank_down, ["dt_rank: expected 3, got 2", "hidden_size 40"]),
              (asserts_no_bias, ["expected a ValueError naming use_bias", "got AssertionError"]),
              (raises_key_error, ["expected a ValueError naming use_bias", "got KeyError"]),
              (rank_from_the_state_size, ["dt_rank: expected 48, got 1"]),
              (expand_fixed_at_two, ["expand: expected 3, got 2"]),
              (by_the_library_config, ["write this yourself", "course.mamba.pretrained.config_from_file"])],
    "5.5.3": [(keeps_padding, ["backbone.embeddings.weight: expected shape (13, 4), got (16, 4) (only the vocab_size real rows)"]),
              (writes_lm_head, ["lm_head.weight is tied"]),
              (original_names, ["missing ['backbone.embeddings.weight']"]),
              (by_the_library_saver, ["write this yourself", "course.mamba.Mamba.save_pretrained"])],
}


@pytest.mark.parametrize("exercise_id,wrong,words", known_wrong.cases(KNOWN_WRONG))
def test_known_wrong_answer_fails_saying_why(exercise_id, wrong, words, capsys):
    known_wrong.assert_fails_saying(exercise_id, wrong, words)


# ---- right answers written otherwise ---------------------------------------------------------

def to_course_state_with_pad(tensors, multiple=8):
    state = {("embedding.weight" if k.endswith("embeddings.weight") else k[len("backbone."):] if
              k.startswith("backbone.") else k): v for k, v in tensors.items() if k != "lm_head.weight"}
    emb = state["embedding.weight"]
    state["embedding.weight"] = np.pad(emb, ((0, (-len(emb)) % multiple), (0, 0)))
    return state


def mamba_config_from_either(d):
    if d.get("use_bias"):
        raise ValueError("use_bias: the course's projections have no bias")
    ssm = d.get("ssm_cfg") or {}
    pick = lambda *keys, default=None: next((src[k] for src in (d, ssm) for k in keys if k in src), default)  # noqa: E731
    return MambaConfig(d_model=pick("hidden_size", "d_model"), n_layer=pick("num_hidden_layers", "n_layer"),
                       vocab_size=pick("vocab_size"), d_state=pick("state_size", "d_state", default=16),
                       expand=pick("expand", default=2), d_conv=pick("conv_kernel", "d_conv", default=4),
                       dt_rank=pick("time_step_rank", "dt_rank", default="auto"))


def to_hf_tensors_by_comprehension(state, vocab_size):
    return {("backbone.embeddings.weight" if k == "embedding.weight" else f"backbone.{k}"):
            (v[:vocab_size] if k == "embedding.weight" else v) for k, v in state.items() if k != "lm_head.weight"}


@pytest.mark.parametrize("exercise_id,candidate", [
    ("5.5.1", to_course_state_with_pad), ("5.5.2", mamba_config_from_either), ("5.5.2", mamba_config_by_table), ("5.5.2", mamba_config_one_path),
    ("5.5.3", to_hf_tensors_by_comprehension), ("5.5.1", popping(to_course_state)),
    ("5.5.3", popping(to_hf_tensors))])
def test_right_answers_written_otherwise_pass(exercise_id, candidate, capsys):
    assert check(exercise_id, candidate).status == "passed", capsys.readouterr().out
