"""The one prompt format every benchmark uses (ours and the transformers peers alike).

Code (HumanEval format), for instruct models: the chat template renders the user message
'Complete the following Python function:' + newline + a python code fence around the problem
prompt; the assistant's reply is pre-filled with the opening fence and the problem prompt.
Generation stops at a newline followed by a closing fence, and the generated text is the
completion (the function body). Edits: the instruction and the code as the user message, the reply
pre-filled with the opening fence, stopped at the closing one (the generated text is the edited
code). Chat (Spec-Bench): the first user turn through the
chat template. Without a chat template (base models) the raw problem / question is the prompt.
The rendered text is passed to ``Pair.generate`` with ``chat=False``.
"""

from __future__ import annotations

from dataclasses import dataclass

from .datasets import Sample

CODE_STOP = "\n```"
FORMAT_VERSION = 1  # bump when the rendered prompts change: results from older runs are not comparable


@dataclass(frozen=True)
class Prompt:
    text: str  # the full text to encode (chat template already applied), for chat=False
    stop: tuple[str, ...]  # stop strings ((), EOS only)


def has_chat_template(tokenizer) -> bool:
    return getattr(tokenizer, "chat_template", None) is not None


def render_chat(tokenizer, user: str) -> str:
    messages = [{"role": "user", "content": user}]
    return tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)


def build_prompt(tokenizer, sample: Sample) -> Prompt:
    """The prompt text and stop strings for one sample."""
    if sample.kind == "code":
        code = sample.problem["prompt"]
        if not has_chat_template(tokenizer):
            return Prompt(code, (CODE_STOP,))
        user = f"Complete the following Python function:\n```python\n{code}```"
        return Prompt(render_chat(tokenizer, user) + "```python\n" + code, (CODE_STOP,))
    if sample.kind == "edit":  # the answer is the edited code: pre-filled fence, stops at the closing one
        head = render_chat(tokenizer, sample.question) if has_chat_template(tokenizer) else sample.question + "\n"
        return Prompt(head + "```python\n", (CODE_STOP,))
    if not has_chat_template(tokenizer):
        return Prompt(sample.question, ())
    return Prompt(render_chat(tokenizer, sample.question), ())
