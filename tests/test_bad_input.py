"""Every user error is a clear SpecdecError in the API and one line (no traceback) in the CLI."""

import subprocess
import sys
from pathlib import Path

import pytest

import specdec
from specdec.errors import SpecdecError
from tinymodels import byte_tokenizer, tiny_model


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"k": 0}, "k (draft length) must be 'auto' or an integer in [1, 32]"),
        ({"k": 33}, "k (draft length) must be 'auto' or an integer in [1, 32], got 33"),
        ({"k": 10**6}, "k (draft length)"),
        ({"k": -3}, "k (draft length)"),
        ({"k": -1}, "k (draft length) must be 'auto' or an integer in [1, 32], got -1"),
        ({"k": "fast"}, "k (draft length) must be 'auto' or an integer in [1, 32], got 'fast'"),
        ({"k": 2.5}, "k (draft length)"),
        ({"temperature": -0.5}, "temperature must be a number >= 0"),
        ({"policy": "bogus"}, "unknown policy 'bogus'"),
        ({"drafter": "bogus"}, "unknown drafter 'bogus'"),
        ({"max_new_tokens": 0}, "max_new_tokens must be"),
        ({"top_p": 0}, "top_p must be a number in (0, 1]"),
        ({"ngram_max": 1, "ngram_min": 2, "drafter": "pld"}, "n-gram range"),
        ({"policy": "lossless", "theta": 0.5}, "takes no parameters"),
    ],
)
def test_bad_request_parameters(tiny_pair, kwargs, message):
    with pytest.raises(SpecdecError, match=message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
        tiny_pair.generate("hello", **kwargs)


def _number_options() -> list[tuple[dict, str]]:
    """Every rule and drafter option that takes a number, with the policy or drafter naming it."""
    from specdec.checks import options_of
    from specdec.core.drafters import DRAFTERS
    from specdec.core.verify.policy import RULES

    out = [({"policy": name}, opt) for name, rule in RULES.items()
           for opt, (spec, _) in options_of(rule).items() if spec.kind in (int, float)]
    out += [({"drafter": name}, opt) for name, cls in DRAFTERS.items()
            for opt, (spec, _) in options_of(cls.Options).items() if spec.kind in (int, float)]
    return out


NUMBER_OPTIONS = _number_options()


@pytest.mark.parametrize("where, option", NUMBER_OPTIONS, ids=[f"{next(iter(w.values()))}-{o}" for w, o in NUMBER_OPTIONS])
@pytest.mark.parametrize("huge", [10**400, -(10**400), 2**1024, 10**309], ids=["1e400", "-1e400", "2^1024", "1e309"])
def test_a_huge_integer_parameter_is_a_specdec_error(where, option, huge):
    """JSON's ``1`` followed by 400 zeros is a Python int no float holds: checked for size before
    any float arithmetic (it was an OverflowError from math.isfinite)."""
    with pytest.raises(SpecdecError, match=f"{option} must be") as err:
        specdec.make_config(**where, **{option: huge})
    assert "\n" not in str(err.value) and len(str(err.value)) < 200


def test_huge_numbers_in_every_checked_place():
    from specdec.checks import check_int, check_number

    for value in (10**400, 2**1024, -(2**5000)):
        with pytest.raises(SpecdecError, match="got an integer of about"):
            check_number("x", value, 0, 1)
        with pytest.raises(SpecdecError, match="x must be a finite number, got an integer"):
            check_number("x", value)
        with pytest.raises(SpecdecError, match="x must be an integer"):
            check_int("x", value, lo=0)
    assert check_number("x", 2**1023) == float(2**1023)
    with pytest.raises(SpecdecError, match="at most 9223372036854775807"):
        check_int("max_new_tokens", 2**63, lo=1)
    for name in ("max_new_tokens", "top_k", "seed"):
        with pytest.raises(SpecdecError, match=name):
            specdec.make_config(**{name: 10**400})


def test_empty_prompt(tiny_pair):
    for prompt in ("", [], None):
        with pytest.raises(SpecdecError, match="empty|non-empty"):
            tiny_pair.generate(prompt)


def test_prompt_over_context_length(tiny_pair):
    too_long = "a" * (tiny_pair.target.max_length + 5)
    with pytest.raises(SpecdecError, match="context holds 512"):
        tiny_pair.generate(too_long, chat=False)


def test_generation_stops_at_the_context_limit(tiny_pair):
    prompt = "a" * (tiny_pair.target.max_length - 10)
    out = tiny_pair.generate(prompt, chat=False, k=8, max_new_tokens=100)
    assert out.finish_reason == "length" and len(out.token_ids) <= 10


def test_missing_model_path():
    with pytest.raises(SpecdecError, match="model not found"):
        specdec.load("/no/such/model/folder", draft=None)
    with pytest.raises(SpecdecError, match="model not found"):
        specdec.load("./missing.gguf", draft=None)


def test_folder_without_config(tmp_path):
    with pytest.raises(SpecdecError, match="no config.json"):
        specdec.load(str(tmp_path), draft=None)


def test_mismatched_vocabularies(tmp_path, tiny_dirs):
    target, _ = tiny_dirs
    other = tmp_path / "other"
    tiny_model(9).save_pretrained(other)
    byte_tokenizer(shuffle_seed=1).save_pretrained(other)
    with pytest.raises(SpecdecError, match="do not share a tokenizer"):
        specdec.load(str(target), draft=str(other), dtype="float32", progress=False)


def test_model_drafter_without_draft(tiny_dirs, monkeypatch):
    """Refused before the prompt is encoded, and a request's settings are checked once: the API runs
    Engine.admit's two halves (check_config, then admit_prompt after encoding); before, it checked
    the settings, then admit checked them again."""
    pair = specdec.load(str(tiny_dirs[0]), draft=None, dtype="float32", progress=False)
    encoded, checked, encode, check = [], [], pair.encode, pair.engine.check_config
    monkeypatch.setattr(pair, "encode", lambda *a, **kw: encoded.append(a) or encode(*a, **kw))
    monkeypatch.setattr(pair.engine, "check_config", lambda cfg: checked.append(cfg) or check(cfg))
    with pytest.raises(SpecdecError, match="needs a draft model"):
        pair.generate("hi", drafter="model")
    assert encoded == [] and len(checked) == 1
    assert pair.generate("hi", drafter="pld", max_new_tokens=4).token_ids
    assert len(encoded) == 1 and len(checked) == 2


def test_bad_dtype_device_quant(tiny_dirs):
    with pytest.raises(SpecdecError, match="unknown dtype"):
        specdec.load(str(tiny_dirs[0]), draft=None, dtype="int3")
    with pytest.raises(SpecdecError, match="unknown device"):
        specdec.load(str(tiny_dirs[0]), draft=None, device="tpu")
    with pytest.raises(SpecdecError, match="unknown draft quantization"):
        specdec.load(str(tiny_dirs[0]), draft=None, draft_quant="int4")


def test_bad_chat_messages(tiny_pair):
    with pytest.raises(SpecdecError, match="role"):
        tiny_pair.generate([{"role": "user"}])
    with pytest.raises(SpecdecError, match="stop strings"):
        tiny_pair.generate("hi", stop=[""])


def run_cli(*args, stdin=None):
    return subprocess.run([sys.executable, "-m", "specdec", *args], capture_output=True, text=True, input=stdin,
                          timeout=300)


@pytest.mark.parametrize(
    "args, message",
    [
        (["generate", "hi", "-k", "0"], "k (draft length) must be 'auto' or an integer in [1, 32]"),
        (["generate", "hi", "--temperature", "-1"], "temperature must be a number >= 0"),
        (["generate", "hi", "--policy", "nope"], "unknown policy 'nope'"),
        (["generate", "hi", "--drafter", "nope"], "unknown drafter 'nope'"),
        (["generate", "hi", "--min-confidence", "1.5"], "min_confidence must be a number in [0, 1)"),
        (["generate", "hi", "--drafter", "pld", "--min-confidence", "0.5"], "drafter 'pld' takes ngram_max, ngram_min"),
        (["generate", "", "--target", "x"], "the prompt is empty"),
        (["generate", "hi", "--target", "/missing/model"], "model not found"),
        (["models", "prepare", "nope"], "unknown bundled model 'nope'"),
    ],
)
def test_cli_user_errors_have_no_traceback(args, message):
    res = run_cli(*args)
    assert res.returncode == 2
    assert res.stderr.strip().splitlines()[-1].startswith("specdec: error: ")
    assert message in res.stderr
    assert "Traceback" not in res.stderr


def test_cli_mismatched_vocab_and_long_prompt(tmp_path, tiny_dirs):
    target, _ = tiny_dirs
    other = tmp_path / "other"
    tiny_model(9).save_pretrained(other)
    byte_tokenizer(shuffle_seed=1).save_pretrained(other)
    res = run_cli("generate", "hi", "--target", str(target), "--draft", str(other))
    assert res.returncode == 2 and "do not share a tokenizer" in res.stderr and "Traceback" not in res.stderr
    res = run_cli("generate", "-", "--target", str(target), "--draft", "none", "--no-chat", stdin="b" * 600)
    assert res.returncode == 2 and "context holds 512" in res.stderr and "Traceback" not in res.stderr


@pytest.mark.parametrize("flags", [["--temperature", "1e-300"], ["--temperature", "5e-324"],
                                   ["--temperature", "1", "--top-p", "1e-46", "--seed", "1"]],
                         ids=["T 1e-300", "T 5e-324", "top_p 1e-46"])
def test_cli_tiny_temperature_and_top_p_generate(tiny_dirs, flags):
    """These printed a traceback (inf logits, NaN in multinomial): now below the 1e-5 floor a
    temperature is greedy, and any top_p keeps the top token."""
    target, _ = tiny_dirs
    res = run_cli("generate", "hello", "--target", str(target), "--draft", "none", "--no-calibrate", "--no-chat",
                  "--max-new-tokens", "4", "-q", *flags)
    assert res.returncode == 0, res.stderr
    assert "Traceback" not in res.stderr and res.stdout.strip()


def test_cli_arguments_that_are_not_utf8_are_one_line_errors(tmp_path):
    """An argument with bytes that are not UTF-8 reaches Python as lone surrogates: refused in one
    line before anything loads."""
    for args in (["generate", "hi\udcff there"], ["generate", "hi", "--stop", "\udcc3"],
                 ["serve", "--served-model-name", "m\udcff"]):
        res = run_cli(*args)
        assert res.returncode == 2, res.stderr
        assert res.stderr.strip().startswith("specdec: error: argument ") and len(res.stderr.strip().splitlines()) == 1
        assert "not UTF-8" in res.stderr and "Traceback" not in res.stderr
    res = subprocess.run([sys.executable, "-m", "specdec", "generate", "-", "--target", str(tmp_path / "none")],
                         input=b"a\xff\xfeb", capture_output=True, timeout=300)
    assert res.returncode == 2
    assert res.stderr.decode().strip() == "specdec: error: the prompt on stdin is not UTF-8 text (byte 1: b'\\xff')"


def test_cli_argparse_errors_exit_2():
    res = run_cli("generate", "hi", "--max-new-tokens", "five")
    assert res.returncode == 2 and "invalid int value" in res.stderr
    res = run_cli("generate", "hi", "-k", "five")  # -k takes 'auto' too: checked with the other request fields
    assert res.returncode == 2 and res.stderr.strip() == (
        "specdec: error: k (draft length) must be 'auto' or an integer in [1, 32], got 'five'")


def test_bad_draft_dtype_and_config_with_keywords(tiny_dirs, tiny_pair):
    with pytest.raises(SpecdecError, match="unknown dtype 'int3'"):
        specdec.load(str(tiny_dirs[0]), draft=str(tiny_dirs[1]), draft_dtype="int3", progress=False)
    config = specdec.frontends.api.make_config(k=3)
    with pytest.raises(SpecdecError, match=r"pass either config= or decoding keywords, not both \(got \['k'\]\)"):
        tiny_pair.generate("hi", config=config, k=4)
    with pytest.raises(SpecdecError, match=r"config must be a DecodeConfig \(specdec.make_config\(...\)\) or a config "
                                           r"file's path, got dict"):
        tiny_pair.generate("hi", config={"k": 3})


def test_cli_bad_draft_dtype_is_a_usage_error():
    res = run_cli("generate", "hi", "--draft-dtype", "int3")
    assert res.returncode == 2 and "invalid choice: 'int3'" in res.stderr and "Traceback" not in res.stderr
    res = run_cli("calibrate", "--dtype", "int3")
    assert res.returncode == 2 and "invalid choice: 'int3'" in res.stderr


def test_options_that_size_a_round_are_bounded():
    """The most work a round can ask for: k <= MAX_K, FLy's window no longer than a draft can be
    (k=auto would draft window + 1 tokens without a cost table), prompt lookup's n-gram."""
    from specdec.checks import options_of
    from specdec.core.drafters.lookup import MAX_NGRAM, LookupOptions
    from specdec.core.request import MAX_K
    from specdec.core.verify.fly import Fly

    assert options_of(Fly)["window"][0].hi <= MAX_K
    assert options_of(LookupOptions)["ngram_max"][0].hi == MAX_NGRAM
    for options in ({"policy": "fly", "window": MAX_K + 1}, {"drafter": "pld", "ngram_max": MAX_NGRAM + 1},
                    {"k": MAX_K + 1}):
        with pytest.raises(SpecdecError):
            specdec.make_config(**options)


SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"


@pytest.mark.parametrize("value", ["-1", "nan", "inf", "1e308", "1" * 5000])
def test_a_script_s_numeric_flag_is_checked_as_the_cli_s(value):
    """``copy_pricing_variants.py --clock-premium -1|nan|inf`` ended in a 14-line traceback, and
    ``1e308`` printed 0.000x for everything: now argparse's usage error, status 2."""
    res = subprocess.run([sys.executable, str(SCRIPTS / "copy_pricing_variants.py"), "--costs", "none.json",
                          "--clock-premium", value, "none.jsonl"], capture_output=True, text=True, timeout=300)
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr[-2000:]
    last = res.stderr.strip().splitlines()[-1]
    assert last.startswith("copy_pricing_variants.py: error: argument --clock-premium: the value must be a number")
    assert len(last) < 200, last


def test_every_numeric_flag_of_the_scripts_is_checked():
    """Each argparse flag of scripts/*.py that takes a number goes through specdec.checks.number_arg
    (its range checked, NaN and infinities refused), not a bare int or float."""
    import re

    bare = [f"{path.name}:{i}" for path in sorted(SCRIPTS.glob("*.py"))
            for i, line in enumerate(path.read_text().splitlines(), 1)
            if re.search(r"type=(int|float)\b|\[(int|float)\(x\) for x in", line)]
    assert not bare, bare


def test_number_arg_bounds():
    import argparse

    from specdec.checks import number_arg

    assert number_arg(int, 1, 8)("8") == 8 and number_arg(float, 0, 1)("0.5") == 0.5
    for parse, text in ((number_arg(int, 1, 8), "9"), (number_arg(int, 1, 8), "2.5"), (number_arg(float, 0, 1), "nan"),
                        (number_arg(float, 0, 1, lo_open=True), "0"), (number_arg(int, 1), "9" * 5000)):
        with pytest.raises(argparse.ArgumentTypeError) as err:
            parse(text)
        assert len(str(err.value)) < 200
