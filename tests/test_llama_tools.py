"""llama.cpp's llama-speculative-simple as a peer: output parsing on a captured real run, finding
the binary, and the error when it is missing. None of these need the binary."""

import os
import stat
import sys

import pytest

from specdec.bench.running import llama_tools
from specdec.errors import SpecdecError

# Captured from a real run (llama-cpp-python 0.3.36's vendored llama.cpp, built by
# scripts/build_llama_tools.sh) of qwen2.5-coder-1.5b with draft qwen2.5-coder-0.5b:
#   llama-speculative-simple -m ...1.5b.gguf -md ...0.5b.gguf --spec-type draft-simple
#     --spec-draft-n-max 4 --spec-draft-n-min 0 --spec-draft-p-min 0 -f prompt.txt --no-escape -n 64
#     -c 4096 -b 4096 -t 2 -tb 2 -td 2 -tbd 2 --seed 0 --color off --temp 0 --top-k 1
PROMPT = (
    "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n"
    "<|im_start|>user\nWrite a Python function that returns the n-th Fibonacci number.<|im_end|>\n"
    "<|im_start|>assistant\n"
)
GENERATED = (
    "```python\ndef fibonacci(n):\n    # Base cases\n    if n == 0:\n        return 0\n    elif n == 1:\n"
    "        return 1\n    \n    # Recursive case\n    return fibonacci(n-1) + fibonacci(n-2)\n```\n\n"
    "This function uses recursion to calculate the n-th Fibonacci number. The"
)
STDOUT = "\n\n" + PROMPT + GENERATED + "\n\n\n\n"
STDERR = (
    "0.01.344.149 W load: control-looking token: 128247 '</s>' was not control-type; this is probably a bug in "
    "the model. its type will be overridden\n"
    "0.03.271.887 I cmn          init: llama threadpool init, n_threads = 2\n"
    "0.03.461.662 I common_speculative_init_result: loading draft model "
    "'/root/.cache/specdec/gguf-files/qwen2.5-coder-0.5b.gguf'\n"
    "0.03.754.757 W load: control-looking token: 128247 '</s>' was not control-type; this is probably a bug in "
    "the model. its type will be overridden\n"
    "0.35.967.710 I encoded   41 tokens in    6.467 seconds, speed:    6.340 t/s\n"
    "0.35.967.730 I decoded   69 tokens in   24.814 seconds, speed:    2.781 t/s\n"
    "0.35.967.743 I \n"
    "0.35.967.755 I n_draft   = 4\n"
    "0.35.967.768 I n_predict = 69\n"
    "0.35.967.780 I n_drafted = 60\n"
    "0.35.967.793 I n_accept  = 54\n"
    "0.35.967.806 I accept    = 90.000%\n"
    "0.35.967.819 I \n"
    "0.35.967.850 I draft:\n\n"
    "0.35.967.906 I \n"
    "0.35.967.920 I target:\n\n"
    "0.35.967.934 I common_perf_print:    sampling time =      22.55 ms\n"
    "0.35.967.947 I common_perf_print:    samplers time =       7.60 ms /    69 tokens\n"
    "0.35.967.961 I common_perf_print:        load time =    2283.43 ms\n"
    "0.35.967.976 I common_perf_print: prompt eval time =   21223.67 ms /   117 tokens (  181.40 ms per token,"
    "     5.51 tokens per second)\n"
    "0.35.967.991 I common_perf_print:        eval time =       0.00 ms /     1 runs   (    0.00 ms per token,"
    "      inf tokens per second)\n"
    "0.35.968.004 I common_perf_print:       total time =   32506.40 ms /   118 tokens\n"
    "0.35.968.018 I common_perf_print: unaccounted time =   11260.18 ms /  34.6 %      (total - sampling - "
    "prompt eval - eval) / (total)\n"
    "0.35.968.031 I common_perf_print:    graphs reused =         15\n"
)


def test_parse_captured_output():
    res = llama_tools.parse_speculative_simple(STDOUT, STDERR, PROMPT)
    assert res["text"] == GENERATED
    assert res["prompt_echo_matches"] is True
    assert (res["n_predict"], res["n_drafted"], res["n_accept"], res["n_draft"]) == (69, 60, 54, 4)
    assert res["accept_percent"] == pytest.approx(90.0)
    assert res["n_prompt"] == 41
    assert res["encode_seconds"] == pytest.approx(6.467)
    assert res["decode_seconds"] == pytest.approx(24.814)
    assert res["decode_tokens"] == 69
    assert res["tokens_per_second"] == pytest.approx(2.781)
    assert res["target_perf"]["prompt_eval_time_ms"] == pytest.approx(21223.67)
    assert res["target_perf"]["prompt_eval_time_n"] == 117
    assert res["target_perf"]["load_time_ms"] == pytest.approx(2283.43)


def test_parse_without_prompt_and_without_drafts():
    stderr = STDERR.replace("n_drafted = 60", "n_drafted = 0").replace("accept    = 90.000%", "accept    = -nan%")
    res = llama_tools.parse_speculative_simple(STDOUT, stderr)
    assert res["text"] == PROMPT + GENERATED and res["prompt_echo_matches"] is False
    assert res["n_drafted"] == 0
    assert res["accept_percent"] != res["accept_percent"]  # nan


def test_parse_rejects_unrecognised_output():
    with pytest.raises(SpecdecError, match="n_predict"):
        llama_tools.parse_speculative_simple("", "error: something else\n")


def test_cut_at_stops():
    assert llama_tools.cut_at_stops(GENERATED, ["```\n", "This"]) == (GENERATED[: GENERATED.index("```\n")], True)
    assert llama_tools.cut_at_stops(GENERATED, ["nope"]) == (GENERATED, False)


def _executable(path):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\nexit 0\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def test_missing_binary_names_the_build_script(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECDEC_LLAMA_TOOLS", str(tmp_path / "none"))
    monkeypatch.setenv("SPECDEC_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert llama_tools.find_tool(llama_tools.SPECULATIVE_SIMPLE) is None
    with pytest.raises(SpecdecError) as e:
        llama_tools.run_speculative_simple("t.gguf", "d.gguf", "hi", n_predict=8, draft_max=4, draft_min=0,
                                           threads=1, ctx=256, seed=0, temperature=0.0)
    msg = str(e.value)
    assert "scripts/build_llama_tools.sh" in msg and "llama-speculative-simple" in msg and "\n" not in msg


def test_find_tool_order(tmp_path, monkeypatch):
    name = "llama-speculative-simple"
    env_dir, home, path_dir = tmp_path / "env", tmp_path / "home", tmp_path / "bin"
    monkeypatch.setenv("SPECDEC_LLAMA_TOOLS", str(env_dir))
    monkeypatch.setenv("SPECDEC_HOME", str(home))
    monkeypatch.setenv("PATH", str(path_dir))
    on_path = _executable(path_dir / name)
    assert llama_tools.find_tool(name) == on_path
    in_home = _executable(home / "llama-tools" / name)
    assert llama_tools.find_tool(name) == in_home
    in_env = _executable(env_dir / name)
    assert llama_tools.find_tool(name) == in_env


def test_arguments_keep_the_prompt_verbatim_and_greedy():
    args = llama_tools.speculative_simple_args("t.gguf", "d.gguf", "p.txt", n_predict=64, draft_max=4, draft_min=0,
                                               threads=2, ctx=4096, seed=0, temperature=0.0)
    assert "--no-escape" in args
    assert args[args.index("--spec-type") + 1] == "draft-simple"
    assert args[args.index("--spec-draft-n-max") + 1] == "4"
    assert args[args.index("--temp") + 1] == "0" and args[args.index("--top-k") + 1] == "1"
    assert args[args.index("-md") + 1] == "d.gguf" and args[args.index("-f") + 1] == "p.txt"
    sampled = llama_tools.speculative_simple_args("t", "d", "p", n_predict=8, draft_max=3, threads=1,
                                                  temperature=0.8, seed=7)
    assert sampled[sampled.index("--temp") + 1] == "0.8" and sampled[sampled.index("--seed") + 1] == "7"
    assert sampled[sampled.index("--min-p") + 1] == "0.0"


FAKE_TOOL = r'''#!{python}
import sys
args = sys.argv[1:]
prompt = open(args[args.index("-f") + 1], encoding="utf-8").read()
if prompt.endswith("\n"):  # as llama.cpp's -f does
    prompt = prompt[:-1]
sys.stdout.write("\n\n" + prompt + {generated!r} + "\n\n\n\n")
sys.stderr.write({stderr!r})
'''


def test_run_with_a_fake_tool(tmp_path, monkeypatch):
    """The prompt reaches the tool byte for byte (including its final newline); output is parsed."""
    tool = tmp_path / "tools" / "llama-speculative-simple"
    tool.parent.mkdir()
    tool.write_text(FAKE_TOOL.format(python=sys.executable, generated=GENERATED, stderr=STDERR))
    tool.chmod(0o755)
    monkeypatch.setenv("SPECDEC_LLAMA_TOOLS", str(tool.parent))
    monkeypatch.setattr(llama_tools, "llama_token_ids", lambda gguf, text: list(range(41)))
    target, draft = tmp_path / "t.gguf", tmp_path / "d.gguf"
    target.write_bytes(b"")
    draft.write_bytes(b"")
    res = llama_tools.run_speculative_simple(target, draft, PROMPT, n_predict=64, draft_max=4, draft_min=0,
                                             threads=2, ctx=4096, seed=0, temperature=0.0, stops=["```\n"],
                                             prompt_ids=list(range(41)))
    assert res["prompt_echo_matches"] is True
    assert res["raw_text"] == GENERATED
    assert res["text"] == GENERATED[: GENERATED.index("```\n")]
    assert res["stopped_at_stop"] is True and res["stopped_at_eos"] is False
    assert (res["n_predict"], res["n_drafted"], res["n_accept"]) == (69, 60, 54)
    assert res["generate_seconds"] == pytest.approx(6.467 + 24.814)
    assert res["seconds"] > 0 and os.path.basename(res["command"][0]) == "llama-speculative-simple"
    assert res["prompt_ids_check"] == "exact"
    # without llama-cpp-python the ids are checked by count, after the run
    monkeypatch.setitem(sys.modules, "llama_cpp", None)
    res = llama_tools.run_speculative_simple(target, draft, PROMPT, n_predict=64, draft_max=4, threads=2,
                                             prompt_ids=list(range(41)))
    assert res["prompt_ids_check"] == "count"
    with pytest.raises(SpecdecError, match="41 tokens"):
        llama_tools.run_speculative_simple(target, draft, PROMPT, n_predict=64, draft_max=4, threads=2,
                                           prompt_ids=[1, 2])


def test_prompt_id_mismatch_is_an_error(monkeypatch):
    monkeypatch.setattr(llama_tools, "llama_token_ids", lambda gguf, text: [1, 2, 3, 9])
    llama_tools.check_prompt_ids("t.gguf", "x", [1, 2, 3, 9])
    with pytest.raises(SpecdecError, match="at token 3"):
        llama_tools.check_prompt_ids("t.gguf", "x", [1, 2, 3, 4])
