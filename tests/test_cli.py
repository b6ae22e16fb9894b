import json
import subprocess
import sys


def run_cli(*args, stdin=None):
    return subprocess.run([sys.executable, "-m", "specdec", *args], capture_output=True, text=True, input=stdin,
                          timeout=300)


def test_help_documents_every_command():
    res = run_cli("--help")
    assert res.returncode == 0
    for command in ("generate", "models"):
        assert command in res.stdout
    gen = run_cli("generate", "--help").stdout
    for flag in ("--policy", "--drafter", "--k", "--max-new-tokens", "--temperature", "--top-p", "--top-k",
                 "--seed", "--stop", "--json", "--dtype", "--device", "--draft-quant", "--chat", "--target",
                 "--draft"):
        assert flag in gen, flag


def test_generate_json_matches_api(tiny_dirs, tiny_pair):
    target, draft = tiny_dirs
    res = run_cli("generate", "abc abc", "--target", str(target), "--draft", str(draft), "--dtype", "float32",
                  "--no-chat", "--json", "--max-new-tokens", "12", "-k", "3")
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    assert set(out) >= {"text", "token_ids", "finish_reason", "stats"}
    assert out["stats"]["new_tokens"] == len(out["token_ids"]) == 12
    api = tiny_pair.generate("abc abc", chat=False, max_new_tokens=12, k=3)
    assert out["token_ids"] == api.token_ids


def test_generate_streams_text_then_stats(tiny_dirs):
    target, draft = tiny_dirs
    res = run_cli("generate", "-", "--target", str(target), "--draft", str(draft), "--no-chat",
                  "--max-new-tokens", "8", stdin="def f():")
    assert res.returncode == 0, res.stderr
    assert "tokens in" in res.stderr and "tau=" in res.stderr
    assert res.stdout.endswith("\n")


def test_models_lists_bundled_pair():
    res = run_cli("models")
    assert res.returncode == 0
    assert "qwen2.5-coder-1.5b" in res.stdout and "qwen2.5-coder-0.5b" in res.stdout


def test_calibrate_explains_only_the_kernels_it_shows(tiny_dirs, tmp_path):
    target, draft = tiny_dirs
    res = run_cli("calibrate", "-q", "--target", str(target), "--draft", str(draft), "--dtype", "float32",
                  "--draft-dtype", "float32", "--draft-quant", "none")
    assert res.returncode == 0, res.stderr
    assert "(* = the variant in use" in res.stdout and "cached under $SPECDEC_HOME/costs" in res.stdout
    assert ("pad1 =" in res.stdout) == ("kernels: pad1" in res.stdout)  # float32 tables use no pad1: no legend
    assert "pad1" not in res.stdout


def test_flags_make_one_request_with_the_drafter_the_pair_will_default_to(tmp_path):
    """The CLI builds its DecodeConfig once, before the models load, with the drafter the loaded
    pair defaults to: the draft model when one is loaded, prompt lookup without one."""
    from specdec.models.bundled import DEFAULT_TARGET
    from specdec.cli import build_parser
    from specdec.frontends.cliargs import decode_config
    from specdec.core.request import DEFAULTS

    parser = build_parser()

    def request(*argv):
        return decode_config(parser.parse_args(["generate", "x", *argv]))

    # the portfolio, with a draft model or without: its sources are what the pair loads
    assert request().drafter == DEFAULTS["drafter"] == "auto"
    assert request("--target", DEFAULT_TARGET, "--draft", "none").drafter == "auto"
    assert request("--target", str(tmp_path), "--draft", str(tmp_path)).drafter == "auto"
    none = request("--draft", "none", "--ngram-max", "3")  # prompt lookup's option, passed to that source
    assert (none.drafter, dict(none.drafter_params)) == ("auto", {"ngram_max": 3})
    assert request("-k", "7", "--max-new-tokens", "9").k == 7
