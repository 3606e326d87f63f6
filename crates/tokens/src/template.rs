//! A model's chat template, rendered as Hugging Face's `apply_chat_template` renders it:
//! Jinja with `trim_blocks` and `lstrip_blocks`, loop controls, Python's string and dict
//! methods, and the globals and filters transformers adds (`raise_exception`,
//! `strftime_now`, a `tojson` that writes what Python's `json.dumps` writes).

use std::fmt::Write as _;

use minijinja::value::{Kwargs, ValueKind};
use minijinja::{Environment, Error, ErrorKind, Value};

/// The name the template is registered under.
const NAME: &str = "chat";

/// A compiled chat template.
pub struct Template {
    env: Environment<'static>,
}

impl Template {
    /// Compiles `source`.
    pub fn new(source: String) -> Result<Template, Error> {
        let mut env = Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_filter("tojson", tojson);
        env.add_function("raise_exception", raise_exception);
        env.add_function("strftime_now", strftime_now);
        env.add_template_owned(NAME, source)?;
        Ok(Template { env })
    }

    /// Renders the template with `context`.
    pub fn render(&self, context: Value) -> Result<String, Error> {
        self.env.get_template(NAME)?.render(context)
    }

    /// Whether the template refuses a system message after the first (Qwen's `loop.first`
    /// guard, say): rendering `[system, user, system, user]`, without tools and with an
    /// empty list of them, fails. vLLM 0.32 probes a template so to decide whether a
    /// Messages request's inline system messages are merged into the leading one.
    pub fn wants_system_first(&self) -> bool {
        let message = |role: &str| Value::from_iter([("role", role), ("content", "t")]);
        let messages = ["system", "user", "system", "user"].map(message);
        let base = [
            ("messages", Value::from(messages.to_vec())),
            ("add_generation_prompt", Value::from(false)),
        ];
        let with_tools = base
            .iter()
            .cloned()
            .chain([("tools", Value::from(Vec::<Value>::new()))]);
        self.render(Value::from_iter(base.iter().cloned())).is_err()
            || self.render(Value::from_iter(with_tools)).is_err()
    }

    /// Whether the template iterates over a message's `content` as a list of parts (the
    /// OpenAI content format) rather than printing it as a string: vLLM's detection,
    /// approximated on the template's source.
    pub fn lists_content(source: &str) -> bool {
        let squeezed: String = source.split_whitespace().collect::<Vec<_>>().join(" ");
        [
            "in message['content']",
            "in message.content",
            "in message[\"content\"]",
        ]
        .iter()
        .any(|pattern| squeezed.contains(&format!("for content {pattern}")))
            || squeezed.contains("for part in message['content']")
            || squeezed.contains("for part in message.content")
    }
}

fn raise_exception(message: String) -> Result<Value, Error> {
    Err(Error::new(ErrorKind::InvalidOperation, message))
}

/// The current date formatted with a `strftime` pattern (the common directives).
fn strftime_now(format: String) -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64);
    strftime(secs, &format)
}

const MONTHS: [&str; 12] = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
];

/// `secs` since the epoch (UTC) formatted with `format`'s `%d %b %B %Y %m %H %M %S %%`.
fn strftime(secs: i64, format: &str) -> String {
    let days = secs.div_euclid(86_400);
    let in_day = secs.rem_euclid(86_400);
    let (year, month, day) = civil(days);
    let mut out = String::new();
    let mut chars = format.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        let _ = match chars.next() {
            Some('d') => write!(out, "{day:02}"),
            Some('b') => write!(out, "{}", &MONTHS[month - 1][..3]),
            Some('B') => write!(out, "{}", MONTHS[month - 1]),
            Some('Y') => write!(out, "{year}"),
            Some('m') => write!(out, "{month:02}"),
            Some('H') => write!(out, "{:02}", in_day / 3600),
            Some('M') => write!(out, "{:02}", in_day / 60 % 60),
            Some('S') => write!(out, "{:02}", in_day % 60),
            Some('%') => write!(out, "%"),
            Some(other) => write!(out, "%{other}"),
            None => write!(out, "%"),
        };
    }
    out
}

/// (year, month 1..=12, day 1..=31) of `days` since 1970-01-01 (proleptic Gregorian).
fn civil(days: i64) -> (i64, usize, i64) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month as usize, day)
}

/// `value | tojson(indent=None)` as transformers defines it: `json.dumps` with
/// `ensure_ascii=False`, its default separators, and keys in their order.
fn tojson(value: Value, kwargs: Kwargs) -> Result<Value, Error> {
    let indent: Option<usize> = kwargs.get("indent")?;
    let _: Option<bool> = kwargs.get("ensure_ascii")?;
    let _: Option<bool> = kwargs.get("sort_keys")?;
    kwargs.assert_all_used()?;
    let mut out = String::new();
    dump(&value, indent, 0, &mut out)?;
    Ok(Value::from_safe_string(out))
}

fn dump(value: &Value, indent: Option<usize>, depth: usize, out: &mut String) -> Result<(), Error> {
    match value.kind() {
        ValueKind::Undefined | ValueKind::None => out.push_str("null"),
        ValueKind::Bool => out.push_str(if value.is_true() { "true" } else { "false" }),
        ValueKind::Number => number(value, out),
        ValueKind::String => string(value.as_str().unwrap_or_default(), out),
        ValueKind::Seq | ValueKind::Iterable => {
            let items: Vec<Value> = value.try_iter()?.collect();
            container(out, '[', ']', indent, depth, items.len(), |i, out| {
                dump(&items[i], indent, depth + 1, out)
            })?;
        }
        ValueKind::Map => {
            let keys: Vec<Value> = value.try_iter()?.collect();
            container(out, '{', '}', indent, depth, keys.len(), |i, out| {
                string(&keys[i].to_string(), out);
                out.push_str(": ");
                dump(&value.get_item(&keys[i])?, indent, depth + 1, out)
            })?;
        }
        _ => string(&value.to_string(), out),
    }
    Ok(())
}

/// Writes `len` items between `open` and `close`, as `json.dumps` lays them out.
fn container(
    out: &mut String,
    open: char,
    close: char,
    indent: Option<usize>,
    depth: usize,
    len: usize,
    mut item: impl FnMut(usize, &mut String) -> Result<(), Error>,
) -> Result<(), Error> {
    out.push(open);
    if len == 0 {
        out.push(close);
        return Ok(());
    }
    for i in 0..len {
        match indent {
            Some(n) => {
                out.push_str(if i == 0 { "\n" } else { ",\n" });
                out.push_str(&" ".repeat(n * (depth + 1)));
            }
            None if i > 0 => out.push_str(", "),
            None => {}
        }
        item(i, out)?;
    }
    if let Some(n) = indent {
        out.push('\n');
        out.push_str(&" ".repeat(n * depth));
    }
    out.push(close);
    Ok(())
}

/// A number as Python's `json.dumps` writes it (`repr` of floats: `1.0`, `1e-05`).
fn number(value: &Value, out: &mut String) {
    if value.is_integer() {
        let _ = write!(out, "{value}");
        return;
    }
    let Ok(f) = f64::try_from(value.clone()) else {
        let _ = write!(out, "{value}");
        return;
    };
    out.push_str(&python_float(f));
}

/// Python's `repr` of a float.
fn python_float(f: f64) -> String {
    if f.is_nan() {
        return "NaN".into();
    }
    if f.is_infinite() {
        return if f > 0.0 { "Infinity" } else { "-Infinity" }.into();
    }
    // Rust's `{:e}` is the shortest round-trip digits, as Python's repr.
    let sci = format!("{f:e}");
    let (mantissa, exp) = sci.split_once('e').unwrap_or((&sci, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    if (-4..16).contains(&exp) {
        let plain = format!("{f}");
        return if plain.contains('.') {
            plain
        } else {
            format!("{plain}.0")
        };
    }
    let sign = if exp < 0 { '-' } else { '+' };
    format!("{mantissa}e{sign}{:02}", exp.abs())
}

/// A JSON string with `ensure_ascii=False`: only `"`, `\` and control characters escaped.
fn string(s: &str, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;

    fn render(source: &str, context: &str) -> String {
        let template = Template::new(source.to_string()).unwrap();
        template
            .render(serde_json::from_str(context).unwrap())
            .unwrap()
    }

    #[test]
    fn tojson_writes_what_python_json_dumps_writes() {
        let context = r#"{"x": {"b": 1, "a": [1.0, 1e-5, 0.0001, 2.5e20, "é\"\n", null, true]}}"#;
        assert_eq!(
            render("{{ x | tojson }}", context),
            r#"{"b": 1, "a": [1.0, 1e-05, 0.0001, 2.5e+20, "é\"\n", null, true]}"#
        );
        assert_eq!(
            render("{{ x.a[:1] | tojson(indent=2) }}", context),
            "[\n  1.0\n]"
        );
    }

    #[test]
    fn python_methods_and_block_trimming_behave_as_in_transformers() {
        let source = "{% for m in messages %}\n  {{ m.content.strip() | upper }}\n{% endfor %}";
        let context = r#"{"messages": [{"content": " a "}, {"content": "b"}]}"#;
        assert_eq!(render(source, context), "  A\n  B\n");
    }

    #[test]
    fn raise_exception_fails_the_render() {
        let template = Template::new("{{ raise_exception('no system') }}".into()).unwrap();
        let error = template.render(Value::from(())).unwrap_err();
        assert!(error.to_string().contains("no system"));
    }

    #[test]
    fn a_template_that_guards_the_system_message_wants_it_first() {
        let guarded = "{% for m in messages %}{% if m.role == 'system' and not loop.first %}\
            {{ raise_exception('System message must be at the beginning.') }}{% endif %}\
            {{ m.content }}{% endfor %}";
        assert!(Template::new(guarded.into()).unwrap().wants_system_first());
        let open = "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}";
        assert!(!Template::new(open.into()).unwrap().wants_system_first());
    }

    #[test]
    fn dates_format_like_strftime() {
        assert_eq!(strftime(0, "%d %b %Y"), "01 Jan 1970");
        assert_eq!(
            strftime(1_721_433_600, "%Y-%m-%d %H:%M %B"),
            "2024-07-20 00:00 July"
        );
    }
}
