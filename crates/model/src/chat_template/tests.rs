//! Unit tests of chat templates on small inline templates.

use super::*;
use std::time::{Duration, UNIX_EPOCH};

const CHATML: &str = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";

fn tmpl(source: &str) -> ChatTemplate {
    ChatTemplate::new(source, SpecialTokens::default()).unwrap()
}

fn user(text: &str) -> Json {
    json!({"role": "user", "content": text})
}

#[test]
fn renders_with_and_without_generation_prompt() {
    let t = tmpl(CHATML);
    let msgs = [
        json!({"role": "system", "content": "Be brief."}),
        user("Hi"),
    ];
    let out = t.render(&msgs, &ChatOptions::default()).unwrap();
    assert_eq!(
        out,
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    );
    let opts = ChatOptions {
        add_generation_prompt: false,
        ..ChatOptions::default()
    };
    assert!(t.render(&msgs, &opts).unwrap().ends_with("Hi<|im_end|>\n"));
    assert_eq!(t.render(&[], &opts).unwrap(), "");
}

#[test]
fn special_tokens_are_variables_and_an_added_bos_is_cut() {
    let source = "{{ bos_token }}{% for m in messages %}{{ m.content }}{{ eos_token }}{% endfor %}";
    let tokens = SpecialTokens {
        bos_token: "<s>".into(),
        eos_token: "</s>".into(),
        add_bos: false,
        add_eos: false,
    };
    let t = ChatTemplate::new(source, tokens.clone()).unwrap();
    assert_eq!(
        t.render(&[user("x")], &ChatOptions::default()).unwrap(),
        "<s>x</s>"
    );
    let t = ChatTemplate::new(
        source,
        SpecialTokens {
            add_bos: true,
            add_eos: true,
            ..tokens
        },
    )
    .unwrap();
    assert_eq!(
        t.render(&[user("x")], &ChatOptions::default()).unwrap(),
        "x"
    );
}

#[test]
fn raise_exception_is_a_clear_error() {
    let t = tmpl(
        "{% if messages[0].role == 'assistant' %}{{ raise_exception('first message must be from the user') }}{% endif %}ok",
    );
    assert_eq!(
        t.render(&[user("a")], &ChatOptions::default()).unwrap(),
        "ok"
    );
    let msgs = [json!({"role": "assistant", "content": "a"}), user("b")];
    let e = t.render(&msgs, &ChatOptions::default()).unwrap_err();
    assert!(
        matches!(&e, ChatTemplateError::Raised(m) if m == "first message must be from the user"),
        "{e}"
    );
}

#[test]
fn bad_templates_are_errors_not_panics() {
    let e = ChatTemplate::new(
        "{% for m in messages %}\n{{ m.content ",
        SpecialTokens::default(),
    )
    .unwrap_err();
    assert!(matches!(e, ChatTemplateError::Syntax(_)), "{e}");
    assert!(e.to_string().contains("line"), "{e}");
    let e = ChatTemplate::new("{% endfor %}", SpecialTokens::default()).unwrap_err();
    assert!(matches!(e, ChatTemplateError::Syntax(_)), "{e}");
    let t = tmpl("{{ messages[0].content + 1 }}");
    let e = t.render(&[user("a")], &ChatOptions::default()).unwrap_err();
    assert!(matches!(e, ChatTemplateError::Render(_)), "{e}");
    let e = t
        .render(&[json!({"role": "user"})], &ChatOptions::default())
        .unwrap_err();
    assert!(matches!(e, ChatTemplateError::InvalidMessages(_)), "{e}");
}

#[test]
fn python_string_methods_and_values_print_like_llama_cpp() {
    let t = tmpl(
        "{% for m in messages %}{{ m.content.strip() }}|{{ m.content.startswith(' he') }}|{{ m.content.split('l') | length }}|{{ m.missing is defined }}|{{ none }}|{{ [1, [2.0, 'x']] }}|{{ {'a': 1} }}|{{ 0.5 }}{% endfor %}",
    );
    assert_eq!(
        t.render(&[user(" hello ")], &ChatOptions::default())
            .unwrap(),
        "hello|True|3|False||12.0x||0.5"
    );
}

#[test]
fn blocks_trim_like_transformers() {
    let t = tmpl(
        "{% for m in messages %}\n  {% if true %}\n{{ m.content }}\n  {% endif %}\n{% endfor %}\n",
    );
    assert_eq!(
        t.render(&[user("a"), user("b")], &ChatOptions::default())
            .unwrap(),
        "a\nb\n"
    );
}

#[test]
fn text_parts_are_joined_for_string_only_templates() {
    let t = tmpl(CHATML);
    assert_eq!(
        t.caps(),
        &TemplateCaps {
            supports_string_content: true,
            supports_typed_content: false,
            supports_system_role: true,
            supports_tools: false,
            supports_tool_calls: false,
            supports_tool_responses: true,
            requires_object_arguments: false,
        }
    );
    let parts = json!({"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]});
    let out = t
        .render(std::slice::from_ref(&parts), &ChatOptions::default())
        .unwrap();
    assert_eq!(
        out,
        "<|im_start|>user\na\nb<|im_end|>\n<|im_start|>assistant\n"
    );

    // A template that walks the parts itself gets them as they are.
    let typed = tmpl(
        "{% for m in messages %}{% if m.content is string %}{{ m.content }}{% else %}{% for p in m.content %}[{{ p.text }}]{% endfor %}{% endif %}{% endfor %}",
    );
    assert!(typed.caps().supports_typed_content && typed.caps().supports_string_content);
    assert_eq!(
        typed.render(&[parts], &ChatOptions::default()).unwrap(),
        "[a][b]"
    );
}

#[test]
fn system_message_merges_when_the_template_ignores_it() {
    let t = tmpl(
        "{% for m in messages %}{% if m.role != 'system' %}{{ m.role }}: {{ m.content }};{% endif %}{% endfor %}",
    );
    assert!(!t.caps().supports_system_role);
    let msgs = [json!({"role": "system", "content": "S"}), user("U")];
    assert_eq!(
        t.render(&msgs, &ChatOptions::default()).unwrap(),
        "user: S\nU;"
    );
}

#[test]
fn a_final_assistant_message_is_continued() {
    let t = tmpl(CHATML);
    let msgs = [user("Hi"), json!({"role": "assistant", "content": "Hel"})];
    let out = t.render(&msgs, &ChatOptions::default()).unwrap();
    assert_eq!(
        out,
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHel"
    );
    let closed = ChatOptions {
        prefill_assistant: false,
        add_generation_prompt: false,
        ..ChatOptions::default()
    };
    assert!(
        t.render(&msgs, &closed)
            .unwrap()
            .ends_with("Hel<|im_end|>\n")
    );
    let two = [user("Hi"), msgs[1].clone(), msgs[1].clone()];
    let e = t.render(&two, &ChatOptions::default()).unwrap_err();
    assert!(matches!(e, ChatTemplateError::InvalidMessages(_)), "{e}");
}

#[test]
fn tojson_is_pythons() {
    let t = tmpl(
        "{{ tools | tojson }}|{{ tools[0].function.parameters | tojson(indent=2) }}|{{ tools | tojson(separators=(',', ':')) }}",
    );
    let opts = ChatOptions {
        tools: Some(
            json!([{"type": "function", "function": {"name": "f", "parameters": {"é": [1, 2.5, true, null, "<x>"]}}}]),
        ),
        ..ChatOptions::default()
    };
    let f = r#"{"name": "f", "description": "", "parameters": {"é": [1, 2.5, true, null, "<x>"]}}"#;
    let compact = r#"{"name":"f","description":"","parameters":{"é":[1,2.5,true,null,"<x>"]}}"#;
    let indented = "{\n  \"é\": [\n    1,\n    2.5,\n    true,\n    null,\n    \"<x>\"\n  ]\n}";
    // Keys keep their order (serde_json's `preserve_order`), as llama.cpp's JSON does.
    assert_eq!(
        t.render(&[], &opts).unwrap(),
        format!(
            "[{{\"type\": \"function\", \"function\": {f}}}]|{indented}|[{{\"type\":\"function\",\"function\":{compact}}}]"
        )
    );
    let bad = ChatOptions {
        tools: Some(json!([{"function": {}}])),
        ..ChatOptions::default()
    };
    assert!(matches!(
        t.render(&[], &bad),
        Err(ChatTemplateError::InvalidMessages(_))
    ));
}

#[test]
fn dates_and_extra_variables() {
    let t = tmpl(
        "{{ strftime_now('%d %B %Y') }}|{{ date_string }}|{{ datetime }}|{{ enable_thinking }}|{{ custom }}",
    );
    let opts = ChatOptions {
        now: Some(UNIX_EPOCH + Duration::from_secs(1_715_949_296)),
        enable_thinking: Some(false),
        extra: [("custom".to_string(), json!("yes"))].into_iter().collect(),
        ..ChatOptions::default()
    };
    assert_eq!(
        t.render(&[], &opts).unwrap(),
        "17 May 2024|17 May 2024|May 17 2024|False|yes"
    );
    let thinking = tmpl("{{ enable_thinking }}");
    assert_eq!(
        thinking.render(&[], &ChatOptions::default()).unwrap(),
        "True"
    );
}

#[test]
fn shareable_across_threads() {
    fn send_sync<T: Send + Sync>() {}
    send_sync::<ChatTemplate>();
}

/// A Qwen 2.5-style template: tools in a system turn, calls written with `tojson`.
const TOOLS_TEMPLATE: &str = r#"{%- if tools %}<|im_start|>system
<tools>{% for tool in tools %}
{{ tool | tojson }}{% endfor %}
</tools><|im_end|>
{% endif %}
{%- for message in messages %}
{%- if message.role == "assistant" and message.tool_calls %}<|im_start|>assistant
{% for tc in message.tool_calls %}<tool_call>
{"name": "{{ tc.function.name }}", "arguments": {{ tc.function.arguments | tojson }}}
</tool_call>{% endfor %}<|im_end|>
{% elif message.role == "tool" %}<|im_start|>user
<tool_response>
{{ message.content }}
</tool_response><|im_end|>
{% else %}<|im_start|>{{ message.role }}
{{ message.content }}<|im_end|>
{% endif %}
{%- endfor %}{% if add_generation_prompt %}<|im_start|>assistant
{% endif %}"#;

#[test]
fn tool_support_is_probed() {
    let caps = *tmpl(CHATML).caps();
    assert!(!caps.supports_tools && !caps.supports_tool_calls);
    assert!(caps.supports_tool_responses && !caps.requires_object_arguments);
    let caps = *tmpl(TOOLS_TEMPLATE).caps();
    assert!(caps.supports_tools && caps.supports_tool_calls && caps.supports_tool_responses);
    assert!(caps.requires_object_arguments);
}

#[test]
fn tool_calls_reach_a_template_that_serialises_arguments_as_objects() {
    let t = tmpl(TOOLS_TEMPLATE);
    let msgs = [
        user("Weather?"),
        json!({"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function",
            "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]}),
        json!({"role": "tool", "tool_call_id": "call_1", "content": "22 C"}),
    ];
    let opts = ChatOptions {
        tools: Some(json!([{"type": "function", "function": {"name": "get_weather"}}])),
        ..ChatOptions::default()
    };
    let out = t.render(&msgs, &opts).unwrap();
    assert!(
        out.contains(r#"{"name": "get_weather", "arguments": {"city": "Paris"}}"#),
        "{out}"
    );
    assert!(
        out.contains(r#""name": "get_weather", "description": """#),
        "{out}"
    );
    assert!(
        out.contains("<tool_response>\n22 C\n</tool_response>"),
        "{out}"
    );
}

#[test]
fn a_template_that_checks_call_ids_still_shows_calls() {
    // Mistral's templates raise on ids that are not 9 characters.
    let t = tmpl(
        r#"{%- for m in messages %}{%- if m.role == "user" %}[INST] {{ m.content }}[/INST]{%- elif m.tool_calls %}[TOOL_CALLS] [{% for tc in m.tool_calls %}{% if tc.id|length != 9 %}{{ raise_exception("Tool call IDs should be alphanumeric strings with length 9!") }}{% endif %}{"name": "{{ tc.function.name }}", "arguments": {{ tc.function.arguments|tojson }}, "id": "{{ tc.id }}"}{% endfor %}]</s>{%- elif m.role == "tool" %}[TOOL_RESULTS] {{ m.content }}[/TOOL_RESULTS]{%- else %} {{ m.content }}</s>{%- endif %}{%- endfor %}"#,
    );
    let caps = t.caps();
    assert!(
        caps.supports_tool_calls && caps.supports_tool_responses,
        "{caps:?}"
    );
    assert!(caps.requires_object_arguments && !caps.supports_tools);
}

#[test]
fn a_template_that_never_ends_runs_out_of_fuel_and_a_big_chat_does_not() {
    let t = tmpl(
        "{% if messages[0].content == 'loop' %}{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}{% endif %}\
         {% if messages[0].content == 'big' %}{% set ns = namespace(s='x') %}{% for i in range(40) %}\
         {% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s|length }}{% endif %}ok",
    );
    for what in ["loop", "big"] {
        let e = t
            .render(&[user(what)], &ChatOptions::default())
            .unwrap_err();
        assert!(
            matches!(&e, ChatTemplateError::Render(m) if m.contains("more work than a render may")),
            "{what}: {e}"
        );
    }
    // A conversation as large as a request body may hold (15 MB) renders in full.
    let chatml = tmpl(CHATML_TEMPLATE);
    let text = "word ".repeat(1000);
    let messages: Vec<Json> = (0..3000).map(|_| user(&text)).collect();
    let out = chatml.render(&messages, &ChatOptions::default()).unwrap();
    assert!(out.len() > 3000 * 5000, "{}", out.len());
}
