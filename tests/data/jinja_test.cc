// The Jinja subset (data/jinja.h) construct by construct. The expected
// texts of kCases are python3-jinja2's, rendered under Hugging Face's
// settings (tests/reference/chat_templates.py's make_environment()) over
// kContext; then load errors naming the line, runtime errors, the limits,
// and fuzzed templates (random bytes, truncations and mutations of the real
// templates, unbalanced tags, deep nesting): one-line errors, never a crash.
#include "data/jinja.h"

#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>

#include <gtest/gtest.h>

#include "core/try.h"

namespace tessera::data::jinja {
namespace {

using ojson = nlohmann::ordered_json;

constexpr std::time_t kNow = 1721952000;  // 2024-07-26 00:00 UTC, for strftime_now

const char* const kContext = R"({
  "m": {"role": "user", "content": "Hi there"},
  "msgs": [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}, {"role": "assistant", "content": "A"}],
  "l": [3, 1, 2], "s": "hello", "n": null})";

struct Case {
  const char* name;
  const char* source;
  const char* expected;
};

const Case kCases[] = {
    {"IfElifElse",
     "{% for x in [1, 2, 3] %}{% if x == 1 %}one{% elif x == 2 %}two{% else %}other{% endif %},{% endfor %}",
     "one,two,other,"},
    {"ForLoopVariables",
     "{% for x in 'abc' %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}{{ loop.revindex0 }}{{ loop.first }}{{ loop.last }}{{ loop.length }};{% endfor %}",
     "1032TrueFalse3;2121FalseFalse3;3210FalseTrue3;"},
    {"ForPrevNextItem",
     "{% for x in [1, 2, 3] %}[{{ loop.previtem }}|{{ loop.nextitem }}]{% endfor %}",
     "[|2][1|3][2|]"},
    {"ForFilterAndElse",
     "{% for x in l if x > 1 %}{{ x }}{{ loop.length }}{% endfor %}|{% for x in [] %}no{% else %}empty{% endfor %}",
     "3222|empty"},
    {"ForUnpacksItems",
     "{% for k, v in m.items() %}{{ k }}={{ v }};{% endfor %}{% for k, v in m|items %}{{ k }};{% endfor %}{% for a, b in [[1, 2], (3, 4)] %}{{ a + b }}{% endfor %}",
     "role=user;content=Hi there;role;content;37"},
    {"ForReverseSlice",
     "{% for x in msgs[::-1] %}{{ x.role }} {{ (msgs|length - 1) - loop.index0 }};{% endfor %}",
     "assistant 2;user 1;system 0;"},
    {"BreakContinue",
     "{% for i in range(10) %}{% if i is odd %}{% continue %}{% endif %}{% if i > 6 %}{% break %}{% endif %}{{ i }}{% endfor %}",
     "0246"},
    {"LoopCycle",
     "{% for i in range(4) %}{{ loop.cycle('a', 'b', 'c') }}{% endfor %}",
     "abca"},
    {"NestedLoops",
     "{% for a in [1, 2] %}{% for b in [1, 2] %}{{ loop.index }}{{ a }}{% endfor %}{{ loop.index }};{% endfor %}",
     "11211;12222;"},
    {"SetScopesToTheLoopBody",
     "{% set x = 1 %}{% for i in [1, 2] %}{{ x }}{% set x = i + 10 %}{{ x }};{% endfor %}{{ x }}",
     "111;112;1"},
    {"SetInsideIfLeaks",
     "{% if true %}{% set y = 'set' %}{% endif %}{{ y }}",
     "set"},
    {"SetTuple",
     "{% set a, b = 1, 2 %}{{ a }}{{ b }}{% set c, d = [3, 4] %}{{ c }}{{ d }}",
     "1234"},
    {"SetBlock",
     "{% set x %}\n  inner {{ 1 + 1 }}\n{% endset %}[{{ x }}]",
     "[  inner 2\n]"},
    {"Namespace",
     "{% set ns = namespace(count=0, found=false, items=[]) %}{% for x in l %}{% set ns.count = ns.count + x %}{% set ns.items = ns.items + [x] %}{% if x == 1 %}{% set ns.found = true %}{% endif %}{% endfor %}{{ ns.count }} {{ ns.found }} {{ ns.items }} {{ ns.missing is defined }}",
     "6 True [3, 1, 2] False"},
    {"NamespaceFromDict",
     "{% set ns = namespace({'a': 1}, b=2) %}{{ ns.a }}{{ ns.b }}{{ ns }}",
     "12<Namespace {'a': 1, 'b': 2}>"},
    {"Macro",
     "{% macro greet(name, greeting='Hello') %}{{ greeting }}, {{ name }}!{% endmacro %}{{ greet('Ann') }} {{ greet('Bob', 'Hi') }} {{ greet(greeting='Yo', name='Cy') }} [{{ greet() }}]",
     "Hello, Ann! Hi, Bob! Yo, Cy! [Hello, !]"},
    {"MacroRecursion",
     "{% macro f(n) %}{% if n > 0 %}{{ n }}{{ f(n - 1) }}{% endif %}{% endmacro %}{{ f(5) }}",
     "54321"},
    {"GenerationTag",
     "{% generation %}inside{% endgeneration %}",
     "inside"},
    {"Raw",
     "{% raw %}{{ not evaluated }}{% endraw %}",
     "{{ not evaluated }}"},
    {"Comments",
     "a{# a comment #}b{#- trimmed -#}  c\n  {# lstripped #}\nd",
     "abc\nd"},
    {"TrimBlocks",
     "{% if true %}\nline\n{% endif %}\nafter",
     "line\nafter"},
    {"LstripBlocks",
     "  {% if true %}\n    text\n  {% endif %}\n  {{ 'var' }}",
     "    text\n  var"},
    {"MinusStrips",
     "a  \n {%- if true -%} \n b \n {%- endif -%}\n  c {{- ' d ' -}} e",
     "abc d e"},
    {"PlusKeeps",
     "  {%+ if true %}x{% endif +%}\ny",
     "  x\ny"},
    {"CrLfAndTrailingNewline",
     "a\r\nb\rc\n",
     "a\nb\nc"},
    {"UnicodeWhitespaceStripped",
     "x　 {{- 'y' -}} z",
     "xyz"},
    {"Literals",
     "{{ 'single' }} {{ \"double\" }} {{ 'esc\\'\\n\\t\\u00e9\\x41\\\\' }} {{ 42 }} {{ -1.5 }} {{ 1e3 }} {{ true }} {{ True }} {{ none }} {{ None }} {{ [1, 'a', none] }} {{ {'k': [1, 2]} }} {{ (1,) }} {{ () }}",
     "single double esc'\n\téA\\ 42 -1.5 1000.0 True True None None [1, 'a', None] {'k': [1, 2]} (1,) ()"},
    {"AttributeAndSubscript",
     "{{ m.role }} {{ m['role'] }} {{ m.missing }}|{{ m['missing'] }}|{{ msgs[0].content }} {{ msgs[-1]['role'] }} {{ msgs[9] }}|{{ 'abc'[1] }}",
     "user user ||S assistant |b"},
    {"Slices",
     "{{ l[1:] }} {{ l[:-1] }} {{ l[::-1] }} {{ l[::2] }} {{ s[1:3] }} {{ s[::-1] }} {{ 'héllo😀'[1:] }} {{ 'héllo😀'[-1] }} {{ l[5:] }}",
     "[1, 2] [3, 1] [2, 1, 3] [3, 2] el olleh éllo😀 😀 []"},
    {"Arithmetic",
     "{{ 1 + 2 }} {{ 7 - 10 }} {{ 3 * 4 }} {{ 7 / 2 }} {{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ -7 % 3 }} {{ 2 ** 10 }} {{ 2 ** -1 }} {{ 1 + 2.5 }} {{ true + 1 }} {{ 'a' ~ 1 ~ none }} {{ 'ab' * 2 }} {{ [1] * 3 }} {{ [1] + [2] }}",
     "3 -3 12 3.5 3 -4 1 2 1024 0.5 3.5 2 a1None abab [1, 1, 1] [1, 2]"},
    {"Comparisons",
     "{{ 1 < 2 }} {{ 1 < 2 < 3 }} {{ 3 > 2 > 2 }} {{ 'a' < 'b' }} {{ [1, 2] < [1, 3] }} {{ 1 == 1.0 }} {{ true == 1 }} {{ 'a' != 'b' }} {{ none == none }} {{ x == y }}",
     "True True False True True True True True True True"},
    {"InAndNotIn",
     "{{ 'a' in 'cat' }} {{ 2 in [1, 2] }} {{ 'role' in m }} {{ 'x' not in m }} {{ 1 in u }}",
     "True True True True False"},
    {"Logic",
     "{{ 1 and 'b' }} {{ 0 and 'b' }} {{ 0 or 'b' }} {{ 'a' or 'b' }} {{ not 0 }} {{ not [] }} {{ not 'a' }} {{ none or 'default' }}",
     "b 0 b a True True False default"},
    {"InlineIf",
     "{{ 'yes' if true else 'no' }} {{ 'yes' if false else 'no' }} [{{ 'yes' if false }}] {{ 'a' if false else 'b' if true else 'c' }}",
     "yes no [] b"},
    {"Precedence",
     "{{ 1 + 2 * 3 }} {{ (1 + 2) * 3 }} {{ -2 ** 2 }} {{ 2 * 3 ~ 'x' }} {{ ' a '|trim + 'b' }} {{ not 1 == 2 }}",
     "7 9 4 6x ab True"},
    {"UndefinedPrintsEmpty",
     "[{{ nothere }}] [{{ m.nothere }}] {{ nothere is defined }} {{ nothere is undefined }} {{ nothere|length }} {{ nothere|default('d') }} {{ nothere ~ 'x' }} {% for x in nothere %}never{% endfor %}{{ nothere == nothere }} {{ m.content.nothere is defined }}",
     "[] [] False True 0 d x True False"},
    {"NoneAttributeIsUndefined",
     "[{{ n.x }}] [{{ n['x'] }}] {{ n.x is defined }}",
     "[] [] False"},
    {"FilterTrimTojson",
     "{{ '  x \\n'|trim }}|{{ 'xxaxx'|trim('x') }}|{{ m|tojson }}|{{ m|tojson(indent=2) }}|{{ [1, {'a': [true, none, 1.5]}]|tojson(indent=4) }}|{{ 'é \"q\" \\n'|tojson }}|{{ {'b': 1, 'a': 2}|tojson(sort_keys=true) }}|{{ [1, 2]|tojson(separators=(',', ':')) }}|{{ 'é😀'|tojson(ensure_ascii=true) }}|{{ []|tojson(indent=2) }}{{ {}|tojson(indent=2) }}",
     "x|a|{\"role\": \"user\", \"content\": \"Hi there\"}|{\n  \"role\": \"user\",\n  \"content\": \"Hi there\"\n}|[\n    1,\n    {\n        \"a\": [\n            true,\n            null,\n            1.5\n        ]\n    }\n]|\"é \\\"q\\\" \\n\"|{\"a\": 2, \"b\": 1}|[1,2]|\"\\u00e9\\ud83d\\ude00\"|[]{}"},
    {"FilterTojsonNumbers",
     "{{ [1, 1.0, 0.1, 1e16, 1e-5, 123456789.5, -0.0, 2.5e-7, 1e15]|tojson }}",
     "[1, 1.0, 0.1, 1e+16, 1e-05, 123456789.5, -0.0, 2.5e-07, 1000000000000000.0]"},
    {"FilterLengthCountDefault",
     "{{ l|length }} {{ 'héllo'|length }} {{ m|count }} {{ ''|default('e') }}|{{ ''|default('e', true) }} {{ 0|d('z', true) }}",
     "3 5 2 |e z"},
    {"FilterItemsJoin",
     "{{ m|items|list }} {{ l|join(', ') }} {{ msgs|join('/', attribute='role') }} {{ [1, none]|join }}",
     "[('role', 'user'), ('content', 'Hi there')] 3, 1, 2 system/user/assistant 1None"},
    {"FilterCase",
     "{{ 'Hello World'|upper }} {{ 'Hello World'|lower }} {{ 'hello WORLD-foo(bar'|title }} {{ 'hello WORLD'|capitalize }} {{ 'straße'|upper }} {{ 'ÀÉÎ'|lower }}",
     "HELLO WORLD hello world Hello World-Foo(Bar Hello world STRASSE àéî"},
    {"FilterFirstLastListString",
     "{{ l|first }} {{ l|last }} {{ 'abc'|first }} {{ m|first }} {{ 'ab'|list }} {{ 5|string }} {{ none|string }} {{ []|first is defined }}",
     "3 2 a role ['a', 'b'] 5 None False"},
    {"FilterIntFloat",
     "{{ '42'|int }} {{ '42.7'|int }} {{ 'x'|int }} {{ 'x'|int(7) }} {{ 4.9|int }} {{ '0x1A'|int(0, 16) }} {{ '1.5'|float }} {{ 'x'|float }} {{ 3|float }}",
     "42 42 0 7 4 26 1.5 0.0 3.0"},
    {"FilterReplaceReverseSort",
     "{{ 'a-b-c'|replace('-', '+') }} {{ 'aaa'|replace('a', 'b', 2) }} {{ l|reverse|list }} {{ 'abc'|reverse }} {{ l|sort }} {{ ['b', 'A', 'a']|sort }} {{ l|sort(reverse=true) }} {{ msgs|sort(attribute='role')|map(attribute='role')|join(',') }}",
     "a+b+c bba [2, 1, 3] cba [1, 2, 3] ['A', 'a', 'b'] [3, 2, 1] assistant,system,user"},
    {"FilterSelectMap",
     "{{ msgs|selectattr('role', 'equalto', 'user')|map(attribute='content')|list }} {{ msgs|rejectattr('role', 'eq', 'user')|map(attribute='role')|list }} {{ [0, 1, '', 'x', none]|select|list }} {{ l|select('odd')|list }} {{ l|reject('odd')|list }} {{ ['A', 'b']|map('lower')|list }} {{ msgs|map(attribute='nope', default='-')|list }} {{ msgs|selectattr('content')|list|length }}",
     "['U'] ['system', 'assistant'] [1, 'x'] [3, 1] [2] ['a', 'b'] ['-', '-', '-'] 3"},
    {"FilterMisc",
     "{{ -3|abs }} {{ 2.5|round }} {{ 3.5|round }} {{ 2.675|round(2) }} {{ 2.1|round(0, 'ceil') }} {{ l|sum }} {{ l|max }} {{ l|min }} {{ [1, 1, 'a', 'A']|unique|list }} {{ 'a\\nb'|indent(2) }} {{ 'x'|safe }}",
     "3 2.0 4.0 2.67 3.0 6 3 1 [1, 'a'] a\n  b x"},
    {"Tests",
     "{{ 1 is number }}{{ 1.0 is float }}{{ 1 is integer }}{{ true is integer }}{{ true is boolean }}{{ 'a' is string }}{{ m is mapping }}{{ l is mapping }}{{ l is iterable }}{{ 1 is iterable }}{{ l is sequence }}{{ n is none }}{{ true is true }}{{ 0 is false }}{{ 3 is odd }}{{ 4 is even }}{{ 9 is divisibleby 3 }}{{ 2 is in l }}{{ 1 is eq 1 }}{{ 1 is equalto 2 }}{{ 'ab' is lower }}{{ 'AB' is upper }}{{ n is not none }}",
     "TrueTrueTrueFalseTrueTrueTrueFalseTrueFalseTrueTrueTrueFalseTrueTrueTrueTrueTrueFalseTrueTrueFalse"},
    {"StringMethods",
     "{{ s.startswith('he') }} {{ s.endswith(('x', 'lo')) }} [{{ '  a b  '.strip() }}] [{{ 'xxaxx'.lstrip('x') }}] [{{ 'xxaxx'.rstrip('x') }}] [{{ '\\n\\nx\\n'.strip('\\n') }}] {{ 'a b  c'.split() }} {{ 'a,b,,c'.split(',') }} {{ 'a,b,c'.split(',', 1) }} {{ 'a,b,c'.rsplit(',', 1) }} {{ s.replace('l', 'L') }} {{ s.upper() }} {{ 'HeLLo'.lower() }} {{ 'hello world'.title() }} {{ '{} and {x}'.format(1, x=2) }} {{ '-'.join(['a', 'b']) }} {{ s.find('l') }} {{ s.count('l') }} {{ 'l1\\nl2'.splitlines() }}",
     "True True [a b] [axx] [xxa] [x] ['a', 'b', 'c'] ['a', 'b', '', 'c'] ['a', 'b,c'] ['a,b', 'c'] heLLo HELLO hello Hello World 1 and 2 a-b 2 2 ['l1', 'l2']"},
    {"ThinkSplit",
     "{% set c = '<think>\\nreason\\n</think>\\n\\nanswer' %}[{{ c.split('</think>')[-1].lstrip('\\n') }}] [{{ c.split('</think>')[0].rstrip('\\n').split('<think>')[-1].lstrip('\\n') }}]",
     "[answer] [reason]"},
    {"DictMethods",
     "{{ m.get('role') }} {{ m.get('x', 'd') }} {{ m.get('x') }} {{ m.keys()|list }} {{ m.values()|list }} {{ m.items()|list }}",
     "user d None ['role', 'content'] ['user', 'Hi there'] [('role', 'user'), ('content', 'Hi there')]"},
    {"Globals",
     "{{ range(3)|list }} {{ range(1, 7, 2)|list }} {{ range(3, 0, -1)|list }} {{ dict(a=1) }} {{ namespace(a=1).a }} {{ strftime_now('%Y-%m-%d') }}",
     "[0, 1, 2] [1, 3, 5] [3, 2, 1] {'a': 1} 1 2024-07-26"},
    {"PythonPrinting",
     "{{ ['it\\'s', \"q\\\"\", 'tab\\t', '\\u00a0', 'é😀', '\\x01'] }} {{ {'a': none, 'b': true, 'c': 1.5} }} {{ (1, 'x') }} {{ 1e20 }} {{ 0.0001 }} {{ 1e-5 }} {{ 10 / 3 }}",
     "[\"it's\", 'q\"', 'tab\\t', '\\xa0', 'é😀', '\\x01'] {'a': None, 'b': True, 'c': 1.5} (1, 'x') 1e+20 0.0001 1e-05 3.3333333333333335"},
    {"PercentFormat",
     "{{ '%s is %d' % ('x', 3) }} {{ '%s' % 'one' }} {{ '100%%' % () }} {{ '%r' % 'q' }}",
     "x is 3 one 100% 'q'"},
};

testing::AssertionResult one_line(const std::string& text) {
  if (!text.empty() && text.find('\n') == std::string::npos) return testing::AssertionSuccess();
  return testing::AssertionFailure() << "not one non-empty line: '" << text << "'";
}

// max_work: lowered so that the work bound is reached quickly under sanitizers.
Result<std::string> render(std::string_view source, const ojson& context = ojson::object(),
                           int64_t max_work = kMaxWork) {
  ASSIGN_OR_RETURN(Template t, Template::parse(source));
  RenderOptions options;
  options.now = kNow;
  options.max_work = max_work;
  return t.render(context, options);
}

std::string load_error(std::string_view source) {
  auto t = Template::parse(source);
  return t.ok() ? std::string("(parsed)") : t.status().message();
}

std::string render_error(std::string_view source, const ojson& context = ojson::object(),
                         int64_t max_work = kMaxWork) {
  auto r = render(source, context, max_work);
  return r.ok() ? "(rendered: " + *r + ")" : r.status().message();
}

TEST(Jinja, EveryConstructMatchesPythonJinja) {
  const ojson context = ojson::parse(kContext);
  for (const Case& c : kCases) {
    SCOPED_TRACE(c.name);
    auto t = Template::parse(c.source);
    ASSERT_TRUE(t.ok()) << t.status().message();
    RenderOptions options;
    options.now = kNow;
    // strftime_now reads local time; the table's date is UTC's.
    if (std::string_view(c.name) == "Globals") {
      std::tm tm{};
      localtime_r(&kNow, &tm);
      if (tm.tm_mday != 26) continue;
    }
    auto out = t->render(context, options);
    ASSERT_TRUE(out.ok()) << out.status().message();
    EXPECT_EQ(*out, c.expected);
  }
}

TEST(Jinja, TemplateIsReusableAndCopyable) {
  auto t = Template::parse("{{ x }}{% set x = 'changed' %}{{ x }}");
  ASSERT_TRUE(t.ok());
  Template copy = *t;
  EXPECT_EQ(*t->render({{"x", 1}}), "1changed");
  EXPECT_EQ(*copy.render({{"x", 2}}), "2changed");
  EXPECT_EQ(*t->render(ojson::object()), "changed");
}

TEST(Jinja, ContextKeepsMemberOrder) {
  ojson ctx = ojson::parse(R"({"d": {"zeta": 1, "alpha": 2, "mid": {"b": 1, "a": 2}}})");
  EXPECT_EQ(*render("{{ d|tojson }} {% for k in d %}{{ k }} {% endfor %}{{ d }}", ctx),
            R"({"zeta": 1, "alpha": 2, "mid": {"b": 1, "a": 2}} zeta alpha mid {'zeta': 1, 'alpha': 2, 'mid': {'b': 1, 'a': 2}})");
}

TEST(Jinja, ContextShadowsGlobals) {
  EXPECT_EQ(*render("{{ range }}", {{"range", "mine"}}), "mine");
  EXPECT_EQ(*render("{{ range(2)|list }}"), "[0, 1]");
}

TEST(Jinja, StrftimeNowDefaultsToTheRealClock) {
  auto t = Template::parse("{{ strftime_now('%d %b %Y') }}");
  ASSERT_TRUE(t.ok());
  const std::time_t before = std::time(nullptr);
  auto out = t->render(ojson::object());
  const std::time_t after = std::time(nullptr);
  ASSERT_TRUE(out.ok());
  auto format = [](std::time_t when) {
    std::tm tm{};
    localtime_r(&when, &tm);
    char buf[64];
    std::strftime(buf, sizeof(buf), "%d %b %Y", &tm);
    return std::string(buf);
  };
  EXPECT_TRUE(*out == format(before) || *out == format(after)) << *out;
}

TEST(Jinja, UnsupportedConstructsAreRefusedAtLoadNamingTheLine) {
  EXPECT_EQ(load_error("a\nb\n{{ x|wordwrap }}"), "chat template line 3: unknown filter 'wordwrap'");
  EXPECT_EQ(load_error("{% if x is shiny %}{% endif %}"), "chat template line 1: unknown test 'shiny'");
  EXPECT_EQ(load_error("\n{% include 'other.jinja' %}"), "chat template line 2: the 'include' tag is not supported");
  EXPECT_EQ(load_error("{% do x.append(1) %}"), "chat template line 1: the 'do' tag is not supported");
  EXPECT_EQ(load_error("{% frobnicate %}"), "chat template line 1: unknown tag 'frobnicate'");
  EXPECT_EQ(load_error("{% for x in y recursive %}{% endfor %}"),
            "chat template line 1: recursive for loops are not supported");
  EXPECT_EQ(load_error("{% call foo() %}{% endcall %}"), "chat template line 1: the 'call' tag is not supported");
  EXPECT_EQ(load_error("{{ f(*args) }}"), "chat template line 1: *args and **kwargs in calls are not supported");
  EXPECT_EQ(load_error("{% set x | trim %}a{% endset %}"),
            "chat template line 1: filters on a block set are not supported");
  EXPECT_EQ(load_error("{% if\n\n x|nope %}{% endif %}"), "chat template line 3: unknown filter 'nope'");
}

TEST(Jinja, SyntaxErrorsNameTheLine) {
  EXPECT_EQ(load_error("ok\n{% if x %}\nnever closed"),
            "chat template line 2: unexpected end of template: this block is never closed with 'endif'");
  EXPECT_EQ(load_error("{% endif %}"), "chat template line 1: unexpected 'endif'");
  EXPECT_EQ(load_error("{% for x in y %}{% endif %}"), "chat template line 1: unexpected 'endif'");
  EXPECT_EQ(load_error("x\n{{ 1 + }}"), "chat template line 2: expected an expression, got '}}'");
  EXPECT_EQ(load_error("{{ (1 }}"), "chat template line 1: unexpected '}', expected ')'");
  EXPECT_EQ(load_error("{{ 1 ]}}"), "chat template line 1: unexpected ']'");
  EXPECT_EQ(load_error("{{ 'open }}"), "chat template line 1: unterminated string");
  EXPECT_EQ(load_error("\n\n{{ x"), "chat template line 3: unexpected end of template: '{{' is never closed");
  EXPECT_EQ(load_error("{# never closed"), "chat template line 1: missing end of comment tag");
  EXPECT_EQ(load_error("{{ a $ b }}"), "chat template line 1: unexpected character '$'");
  EXPECT_EQ(load_error("{% break %}"), "chat template line 1: 'break' outside a for loop");
  EXPECT_EQ(load_error("{% set true = 1 %}"), "chat template line 1: cannot assign to 'true'");
  EXPECT_EQ(load_error("{{ 99999999999999999999 }}"), "chat template line 1: integer 99999999999999999999 is too large");
  EXPECT_EQ(load_error(std::string("{{ '\xff' }}")), "chat template: not valid UTF-8");
}

TEST(Jinja, RuntimeErrorsAreJinjasOneLiners) {
  const ojson ctx = ojson::parse(kContext);
  EXPECT_EQ(render_error("{{ raise_exception('Only user and assistant roles are supported!') }}"),
            "Only user and assistant roles are supported!");
  EXPECT_EQ(render_error("line 1\n{{ n.startswith('x') }}", ctx), "chat template line 2: 'None' has no attribute 'startswith'");
  EXPECT_EQ(render_error("{{ m.nope.deeper }}", ctx), "chat template line 1: 'dict object' has no attribute 'nope'");
  EXPECT_EQ(render_error("{{ nothere.x }}"), "chat template line 1: 'nothere' is undefined");
  EXPECT_EQ(render_error("{{ nothere + 1 }}"), "chat template line 1: 'nothere' is undefined");
  EXPECT_EQ(render_error("{{ [][0].x }}"), "chat template line 1: list object has no element 0");
  EXPECT_EQ(render_error("{{ 'a' + 1 }}"), "chat template line 1: can only concatenate str (not \"int\") to str");
  EXPECT_EQ(render_error("{{ 1 + 'a' }}"), "chat template line 1: unsupported operand type(s) for +: 'int' and 'str'");
  EXPECT_EQ(render_error("{{ 1 / 0 }}"), "chat template line 1: division by zero");
  EXPECT_EQ(render_error("{{ 'a' < 1 }}"), "chat template line 1: '<' not supported between instances of 'str' and 'int'");
  EXPECT_EQ(render_error("{% for x in 5 %}{% endfor %}"), "chat template line 1: 'int' object is not iterable");
  EXPECT_EQ(render_error("{{ 'a' in none }}"), "chat template line 1: argument of type 'NoneType' is not iterable");
  EXPECT_EQ(render_error("{{ 3|length }}"), "chat template line 1: object of type 'int' has no len()");
  EXPECT_EQ(render_error("{{ nothere|tojson }}"), "chat template line 1: Object of type Undefined is not JSON serializable");
  EXPECT_EQ(render_error("{% set x = 1 %}{% set x.y = 2 %}"), "chat template line 1: cannot assign attribute on non-namespace object");
  EXPECT_EQ(render_error("{{ [1].append(2) }}"), "chat template line 1: access to attribute 'append' of 'list' object is unsafe.");
  EXPECT_EQ(render_error("{{ {}.pop('x') }}"), "chat template line 1: access to attribute 'pop' of 'dict' object is unsafe.");
  EXPECT_EQ(render_error("{% for a, b in [1] %}{% endfor %}"), "chat template line 1: cannot unpack non-iterable int object");
  EXPECT_EQ(render_error("{% for a, b in [[1, 2, 3]] %}{% endfor %}"), "chat template line 1: too many values to unpack (expected 2)");
  EXPECT_EQ(render_error("{% macro f(a) %}{% endmacro %}{{ f(1, 2) }}"), "chat template line 1: macro 'f' takes not more than 1 argument(s)");
  EXPECT_EQ(render_error("{{ 'x'|tojson(indent=2, bogus=1) }}"), "chat template line 1: tojson() got an unexpected keyword argument 'bogus'");
  EXPECT_EQ(render_error("{{ [1]|map('nosuch')|list }}"), "chat template line 1: No filter named 'nosuch'.");
  EXPECT_EQ(render_error("{{ 9223372036854775807 + 1 }}"), "chat template line 1: integer overflow");
  EXPECT_EQ(render_error("{{ m['a\\nb'].x }}", ctx), "chat template line 1: 'dict object' has no attribute 'a\\nb'");
  // The innermost failing line is named.
  EXPECT_EQ(render_error("{% for x in [1] %}\n\n  {{ x.y.z }}\n{% endfor %}"),
            "chat template line 3: 'int object' has no attribute 'y'");
}

TEST(Jinja, ContextMustBeAnObjectOfValidValues) {
  auto t = Template::parse("x");
  ASSERT_TRUE(t.ok());
  EXPECT_FALSE(t->render(ojson::array()).ok());
  ojson deep = ojson::array();
  for (int i = 0; i < 1000; ++i) deep = ojson::array({deep});
  auto r = t->render({{"deep", deep}});
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(one_line(r.status().message()));
  EXPECT_NE(r.status().message().find("nested deeper than"), std::string::npos);
  EXPECT_FALSE(t->render({{"big", ojson(uint64_t{18446744073709551615u})}}).ok());
}

TEST(Jinja, LimitsEndInOneLineErrors) {
  struct Limit {
    const char* source;
    const char* message_part;
    int64_t max_work = int64_t{1} << 20;  // kMaxWork where the limit needs real work to reach
  };
  const Limit limits[] = {
      {"{{ range(100001)|length }}", "Range too big. The sandbox blocks ranges larger than MAX_RANGE (100000)."},
      {"{% for i in range(100000) %}{{ 'x' * 1000 }}{% endfor %}", "the output is longer than", kMaxWork},
      {"{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}", "units of work"},
      {"{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}", "macro calls nested deeper than"},
      {"{% macro f(n) %}{% if n > 0 %}{{ f(n - 1) }}{{ f(n - 1) }}{% endif %}{% endmacro %}{{ f(30) }}", "units of work"},
      {"{% set ns = namespace(l=[1]) %}{% for i in range(40) %}{% set ns.l = ns.l + ns.l %}{% endfor %}", "a list longer than", kMaxWork},
      {"{% set ns = namespace(s='x') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}", "a string longer than", kMaxWork},
      {"{% set ns = namespace(s='x') %}{% for i in range(40) %}{% set ns.s = ns.s + ns.s %}{% endfor %}", "a string longer than", kMaxWork},
      {"{{ 'x' * 100000000 }}", "a string longer than"},
      {"{{ [1] * 100000000 }}", "a list longer than"},
      {"{% set ns = namespace(l=[]) %}{% for i in range(1000) %}{% set ns.l = [ns.l] %}{% endfor %}", "nested deeper than 256"},
      {"{% set ns = namespace() %}{% set ns.self = ns %}", "a namespace cannot be stored inside a namespace"},
      {"{{ 'ab'|replace('', 'x' * 10000000) }}", "a string longer than"},
  };
  for (const Limit& limit : limits) {
    SCOPED_TRACE(limit.source);
    const std::string message = render_error(limit.source, ojson::object(), limit.max_work);
    EXPECT_TRUE(one_line(message));
    EXPECT_NE(message.find(limit.message_part), std::string::npos) << message;
  }
}

TEST(Jinja, DeepNestingIsRefusedAtLoad) {
  auto repeat = [](std::string_view s, int n) {
    std::string out;
    for (int i = 0; i < n; ++i) out += s;
    return out;
  };
  const std::vector<std::string> deep = {
      repeat("{% if true %}", 500) + repeat("{% endif %}", 500),
      repeat("{% for x in [1] %}", 500) + repeat("{% endfor %}", 500),
      "{{ " + repeat("(", 5000) + "1" + repeat(")", 5000) + " }}",
      "{{ " + repeat("[", 5000) + repeat("]", 5000) + " }}",
      "{{ " + repeat("not ", 5000) + "x }}",
      "{{ " + repeat("-", 5000) + "1 }}",
      "{{ x" + repeat("|trim", 5000) + " }}",
      "{{ x" + repeat(".a", 5000) + " }}",
      "{{ x" + repeat("[0]", 5000) + " }}",
      "{{ " + repeat("1 if x else ", 5000) + "1 }}",
      "{{ " + repeat("x ~ ", 50000) + "x }}",
      "{{ 1" + repeat(" + 1", 50000) + " }}",
      "{{ " + repeat("{'a': ", 3000) + "1" + repeat("}", 3000) + " }}",
  };
  for (const std::string& source : deep) {
    SCOPED_TRACE(source.substr(0, 60));
    auto t = Template::parse(source);
    if (t.ok()) {
      auto r = t->render(ojson::object());  // long flat chains may parse; they must still render or fail cleanly
      if (!r.ok()) {
        EXPECT_TRUE(one_line(r.status().message()));
      }
    } else {
      EXPECT_TRUE(one_line(t.status().message())) << t.status().message();
    }
  }
  EXPECT_NE(load_error(repeat("{% if true %}", 500)).find("nested deeper than"), std::string::npos);
}

// Parses and (when that succeeds) renders; asserts a one-line error or success.
void parse_and_render(const std::string& source, const ojson& context) {
  auto t = Template::parse(source);
  if (!t.ok()) {
    EXPECT_TRUE(one_line(t.status().message())) << source;
    return;
  }
  auto r = t->render(context);
  if (!r.ok() && r.status().message().starts_with("chat template")) {
    EXPECT_TRUE(one_line(r.status().message())) << source;
  }
}

std::string read_template(const std::string& name) {
  const std::string path = TESSERA_TEST_DATA_DIR "/../data/raw/tokenizers/" + name + "/tokenizer_config.json";
  std::ifstream in(path, std::ios::binary);
  if (!in) return "";
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return ojson::parse(text)["chat_template"].get<std::string>();
}

const char* const kChat = R"({"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "u"},
  {"role": "assistant", "content": "<think>r</think>a", "tool_calls": [{"function": {"name": "f", "arguments": {"x": 1}}}]},
  {"role": "tool", "content": "t"}], "tools": [{"type": "function"}], "add_generation_prompt": true,
  "bos_token": "<s>", "date_string": "1 Jan 2025"})";

TEST(JinjaFuzz, TruncatedAndMutatedRealTemplates) {
  const std::vector<std::string> sources = {read_template("qwen3"), read_template("llama3_2")};
  if (sources[0].empty() || sources[1].empty()) GTEST_SKIP() << "no data/raw/tokenizers (run scripts/fetch-data.sh)";
  const ojson context = ojson::parse(kChat);
  std::mt19937 rng(29);
  for (const std::string& source : sources) {
    for (size_t cut = 0; cut < source.size(); cut += 7) parse_and_render(source.substr(0, cut), context);
    const std::string alphabet = "{}%#-+()[]|.,'\"\n \\~=<>!*/abcfinorst0123456789";
    for (int round = 0; round < 1500; ++round) {
      std::string s = source;
      const int edits = 1 + static_cast<int>(rng() % 4);
      for (int e = 0; e < edits; ++e) {
        const size_t at = rng() % s.size();
        switch (rng() % 3) {
          case 0: s[at] = alphabet[rng() % alphabet.size()]; break;
          case 1: s.insert(at, 1, alphabet[rng() % alphabet.size()]); break;
          default: s.erase(at, 1 + rng() % 8);
        }
      }
      parse_and_render(s, context);
    }
  }
}

TEST(JinjaFuzz, RandomBytesAndTokenSoup) {
  std::mt19937 rng(7);
  const ojson context = ojson::parse(kChat);
  for (int round = 0; round < 3000; ++round) {
    std::string s(rng() % 200, '\0');
    for (char& c : s) c = static_cast<char>(rng() % 256);
    parse_and_render(s, context);
  }
  const std::vector<std::string> pieces = {
      "{{", "}}", "{%", "%}", "{#", "#}", "{%-", "-%}", "{{-", "-}}", " if ", " for ", " in ", " endif ", " endfor ",
      " else ", " elif ", " set ", " = ", " x ", " messages ", "|", " trim ", " tojson ", "(", ")", "[", "]", "{", "}",
      ",", ":", ".", " is ", " not ", " defined ", " and ", " or ", "'s'", "\"t\"", "1", "2.5", " macro ", " endmacro ",
      " raw ", " endraw ", " loop ", " namespace ", " range ", "\n", "  ", " + ", " ~ ", " * ", " break ", " continue "};
  for (int round = 0; round < 20000; ++round) {
    std::string s;
    const int n = 1 + static_cast<int>(rng() % 30);
    for (int i = 0; i < n; ++i) s += pieces[rng() % pieces.size()];
    parse_and_render(s, context);
  }
}

TEST(JinjaFuzz, UnbalancedTags) {
  const std::vector<std::string> bad = {
      "{%", "%}", "{{", "}}x", "{% if %}", "{% if x %}", "{% endif %}", "{% for %}", "{% for x %}", "{% for x in %}",
      "{% for x in y %}", "{% else %}", "{% elif x %}", "{% if x %}{% endfor %}", "{% macro %}", "{% macro f( %}",
      "{% set %}", "{% set x %}", "{% set x = %}", "{% raw %}", "{{ x }", "{{ x |}}", "{{ x| }}", "{{ x is }}",
      "{{ 'a }}", "{{ (((( }}", "{{ )) }}", "{{ {'a' }}", "{{ {'a': }}", "{{ [1, }}", "{{ x[ }}", "{{ x[1:2:3:4] }}",
      "{{ x. }}", "{{ x.1.2 }}", "{%- -%}", "{# {# #} #}", "{{ 1 if }}", "{{ 1 if 2 else }}", "{% generation %}",
      "{% if x %}{% elif %}{% endif %}", "{% for x in y if %}{% endfor %}", "{{ f(a=) }}", "{{ f(a=1, 2) }}",
  };
  for (const std::string& s : bad) {
    SCOPED_TRACE(s);
    auto t = Template::parse(s);
    if (!t.ok()) {
      EXPECT_TRUE(one_line(t.status().message()));
      EXPECT_TRUE(t.status().message().starts_with("chat template line ")) << t.status().message();
    }
  }
}

}  // namespace
}  // namespace tessera::data::jinja
