#!/usr/bin/env python3
"""The oracle for Tessera's chat templates (src/data/chat_template.h).

Renders every case of tests/reference/chat_templates/cases.json with
python3-jinja2, set up exactly as Hugging Face transformers'
apply_chat_template sets it up (utils/chat_template_utils.py,
_compile_jinja_template and render_jinja_template):

  ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                extensions=[AssistantTracker, jinja2.ext.loopcontrols])
  filters["tojson"]  = json.dumps(x, ensure_ascii=False, indent=indent,
                                  separators=separators, sort_keys=sort_keys)
  globals["raise_exception"] raises jinja2.exceptions.TemplateError(message)
  globals["strftime_now"](fmt) = datetime.now().strftime(fmt)
  template.render(messages=..., tools=... or None, documents=... or None,
                  add_generation_prompt=..., **special_tokens_map, **kwargs)

AssistantTracker is transformers' {% generation %}...{% endgeneration %} tag,
here without its token-mask bookkeeping (render() never activates it).
special_tokens_map is transformers': bos/eos/unk/sep/pad/cls/mask_token and
additional_special_tokens from tokenizer_config.json, each kept when set to
a non-empty value (an AddedToken dict counts as its "content").

strftime_now runs on a fixed clock (FIXED_NOW, noon UTC on 26 Jul 2024, the
same date in every time zone) so the output is deterministic; the C++ test
sets the same clock (ChatTemplate::set_clock_for_testing).

It writes tests/reference/chat_templates/expected.json: for each case name,
{"text": rendered} or {"error": message, "type": exception class name}.
Standard library and jinja2 only. To regenerate after changing cases.json
(needs scripts/fetch-data.sh's data/raw/tokenizers/):

    python3 tests/reference/chat_templates.py
"""

import json
import os
import sys
from datetime import datetime

import jinja2
import jinja2.ext
import jinja2.nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
TOKENIZERS = os.path.join(ROOT, "data", "raw", "tokenizers")
FIXED_NOW = 1721995200  # 2024-07-26 12:00:00 UTC

SPECIAL_TOKENS_ATTRIBUTES = ["bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token",
                             "mask_token", "additional_special_tokens"]


class AssistantTracker(jinja2.ext.Extension):
    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_generation_support"), [], [], body).set_lineno(lineno)

    def _generation_support(self, caller):
        return caller()


def make_environment():
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(format):
        return datetime.fromtimestamp(FIXED_NOW).strftime(format)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[AssistantTracker, jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


def token_text(value):
    if isinstance(value, dict):
        return value.get("content")
    return value


def load_config(name):
    with open(os.path.join(TOKENIZERS, name, "tokenizer_config.json"), encoding="utf-8") as f:
        config = json.load(f)
    special = {}
    for attr in SPECIAL_TOKENS_ATTRIBUTES:
        value = config.get(attr)
        if attr == "additional_special_tokens" and value is not None:
            value = [token_text(v) for v in value]
        else:
            value = token_text(value)
        if value:
            special[attr] = value
    return config["chat_template"], special


def main():
    with open(os.path.join(HERE, "chat_templates", "cases.json"), encoding="utf-8") as f:
        cases = json.load(f)["cases"]
    env = make_environment()
    templates = {}
    expected = {}
    for case in cases:
        name = case["template"]
        if name not in templates:
            source, special = load_config(name)
            templates[name] = (env.from_string(source), special)
        template, special = templates[name]
        kwargs = {**special, **case.get("extra", {})}
        try:
            text = template.render(messages=case["messages"], tools=case.get("tools"),
                                   documents=case.get("documents"),
                                   add_generation_prompt=case["add_generation_prompt"], **kwargs)
            expected[case["name"]] = {"text": text}
        except Exception as e:  # the C++ side must fail the same way
            expected[case["name"]] = {"error": str(e), "type": type(e).__name__}
    out = os.path.join(HERE, "chat_templates", "expected.json")
    with open(out, "w", encoding="utf-8") as f:
        json.dump(expected, f, ensure_ascii=False, indent=1)
        f.write("\n")
    errors = sum(1 for v in expected.values() if "error" in v)
    print(f"{out}: {len(expected)} cases ({errors} raise), jinja2 {jinja2.__version__}", file=sys.stderr)


if __name__ == "__main__":
    main()
