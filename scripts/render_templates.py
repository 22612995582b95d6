#!/usr/bin/env python3
"""Renders every chat template of llama.cpp's suite with Python's jinja2 the way Hugging
Face's `apply_chat_template` does, and stores the results as the fixture that
`tests/chat_templates.rs` compares our renderer with byte for byte.

    scripts/fetch-llamacpp-suite.sh            # the templates (not stored in the repo)
    python3 scripts/render_templates.py        # writes tests/fixtures/templates/renders.json

The environment is transformers' `_compile_jinja_template` (transformers 4.5x,
`utils/chat_template_utils.py`): ImmutableSandboxedEnvironment with trim_blocks,
lstrip_blocks, loopcontrols and the `{% generation %}` tag; `raise_exception`; `strftime_now`; `tojson` replaced by
`json.dumps(x, ensure_ascii=False, indent=..., separators=..., sort_keys=...)`. The
variables are those `apply_chat_template` passes: messages, tools=None, documents=None,
add_generation_prompt, and the special tokens (here bos_token and eos_token, fixed
strings). `strftime_now` reads a fixed instant (FIXED_NOW below; the Rust test uses the
same), so the fixture does not change with the day it was made.

Replies with thinking (conversations `thinking_*`, in pocketchat's transcript shape:
`content` is the answer, `thinking` what the model wrote in <think>…</think>) are given
to each template as the engine gives them (`template_messages` in
src/engine/text/template.rs): to a template that reads `reasoning_content`, as
`content` + `reasoning_content` (as Hugging Face and llama.cpp's server pass them); to
any other, as the model wrote them, `<think>\n{thinking}\n</think>\n\n{answer}`.
Templates that read `enable_thinking` are also rendered with it true and false (cases
with `enable_thinking`, for the conversations in SWITCHED; without it, the variable is undefined: the template's default).

A render that raises stores the error instead: `raised` with the message for the
template's own `raise_exception`, `error` with jinja2's message for any other error.
Needs jinja2 (3.1.6 made the stored file).
"""
import datetime
import glob
import json
import os
import sys

import jinja2
from jinja2 import nodes
from jinja2.ext import Extension, loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SUITE = os.environ.get("POCKETCHAT_LLAMACPP_SUITE", os.path.join(REPO, "models", "llamacpp-suite"))
OUT = os.path.join(REPO, "tests", "fixtures", "templates", "renders.json")

BOS, EOS = "<s>", "</s>"
# Thursday 5 March 2026, 09:07:03 (single-digit day and hour catch unpadded formats).
FIXED_NOW = datetime.datetime(2026, 3, 5, 9, 7, 3)

TRICKY = (
    'She said "hi" and it\'s fine.\nSecond line\n\n  indented line\t(tab)\n'
    "Grüße, naïve café, 日本語, Привет, emoji 🙂\n"
    "{{ messages }} {% if x %}y{% endif %} {# c #} <b>bold</b> & <|im_end|> </s>"
)

CONVERSATIONS = {
    "one_user": [
        {"role": "user", "content": "Hello!"},
    ],
    "system_user": [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "What is 2+2?"},
    ],
    "multi_turn": [
        {"role": "user", "content": "Hi there"},
        {"role": "assistant", "content": "Hello! How can I help?"},
        {"role": "user", "content": "Tell me a joke."},
        {"role": "assistant", "content": "Why did the chicken cross the road?"},
        {"role": "user", "content": "  Why?  "},
    ],
    "system_tricky": [
        {"role": "system", "content": "Answer in <i>French</i> & keep it {{ short }}."},
        {"role": "user", "content": TRICKY},
        {"role": "assistant", "content": "D'accord: « oui » — \"quoted\"\n{% raw %}<p>ok</p>"},
        {"role": "user", "content": "Ünïcödé again: ½ ∑ 中文 🚀"},
    ],
    "thinking_history": [
        {"role": "user", "content": "What is 17 * 3?"},
        {"role": "assistant", "content": "17 * 3 = 51.", "thinking": "17 * 3: 17 * 2 = 34, plus 17 is 51.\nCheck: 50 + 1."},
        {"role": "user", "content": "And 17 * 4?"},
    ],
    "thinking_last_reply": [
        {"role": "system", "content": "Think briefly."},
        {"role": "user", "content": "Is 91 prime?"},
        {"role": "assistant", "content": "No: 91 = 7 * 13.", "thinking": "Try 7: 7 * 13 = 91."},
    ],
}


# The conversations also rendered with enable_thinking true and false.
SWITCHED = ("one_user", "thinking_history", "thinking_last_reply")


class RaisedByTemplate(jinja2.exceptions.TemplateError):
    """What the template's own raise_exception throws (transformers raises TemplateError)."""


class AssistantTracker(Extension):
    """transformers' `{% generation %}` block: renders its body as it is (transformers
    also notes where it lies, for return_assistant_tokens_mask, which changes no text)."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
        return nodes.CallBlock(self.call_method("_generation_support"), [], [], body).set_lineno(lineno)

    def _generation_support(self, caller):
        return caller()


def environment():
    def raise_exception(message):
        raise RaisedByTemplate(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(format):
        return FIXED_NOW.strftime(format)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[AssistantTracker, loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


def template_messages(source, messages):
    """The messages as pocketchat gives them to this template (see the module docs)."""
    reads_reasoning = "reasoning_content" in source
    out = []
    for m in messages:
        m = dict(m)
        thinking = m.pop("thinking", None)
        if thinking is not None:
            if reads_reasoning:
                m["reasoning_content"] = thinking
            else:
                m["content"] = f"<think>\n{thinking}\n</think>\n\n{m['content']}"
        out.append(m)
    return out


def render(env, source, messages, add_generation_prompt, enable_thinking=None):
    try:
        template = env.from_string(source)
        extra = {} if enable_thinking is None else {"enable_thinking": enable_thinking}
        text = template.render(
            messages=template_messages(source, messages),
            tools=None,
            documents=None,
            add_generation_prompt=add_generation_prompt,
            bos_token=BOS,
            eos_token=EOS,
            **extra,
        )
        return {"output": text}
    except RaisedByTemplate as e:
        return {"raised": e.message}
    except Exception as e:  # noqa: BLE001 - any jinja2 error is an expected outcome
        return {"error": f"{type(e).__name__}: {e}"}


def main():
    paths = sorted(glob.glob(os.path.join(SUITE, "templates", "*.jinja")))
    if not paths:
        sys.exit(f"no templates in {SUITE}/templates: run scripts/fetch-llamacpp-suite.sh")
    env = environment()
    cases = []
    for path in paths:
        with open(path, encoding="utf-8") as f:
            source = f.read()
        for name, messages in CONVERSATIONS.items():
            switched = "enable_thinking" in source and name in SWITCHED
            switches = (None, True, False) if switched else (None,)
            for gen in (True, False):
                for thinking in switches:
                    case = {"template": os.path.basename(path), "conversation": name, "add_generation_prompt": gen}
                    if thinking is not None:
                        case["enable_thinking"] = thinking
                    case.update(render(env, source, messages, gen, thinking))
                    cases.append(case)
    fixture = {
        "generated_by": "scripts/render_templates.py",
        "jinja2": jinja2.__version__,
        "bos_token": BOS,
        "eos_token": EOS,
        "now": FIXED_NOW.isoformat(),
        "conversations": CONVERSATIONS,
        "cases": cases,
    }
    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    with open(OUT, "w", encoding="utf-8") as f:
        json.dump(fixture, f, ensure_ascii=False, indent=1)
        f.write("\n")
    ok = sum("output" in c for c in cases)
    raised = sum("raised" in c for c in cases)
    print(f"{len(paths)} templates, {len(cases)} renders: {ok} rendered, {raised} raised, {len(cases) - ok - raised} other errors")
    print(f"wrote {os.path.relpath(OUT, REPO)} ({os.path.getsize(OUT)} bytes)")


if __name__ == "__main__":
    main()
