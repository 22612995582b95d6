//! The pieces of Hugging Face's chat-template environment (transformers'
//! `_compile_jinja_template`, the one `apply_chat_template` renders with) that minijinja
//! does not have or does differently from Python's jinja2: `tojson` as `json.dumps`,
//! `strftime_now`, `raise_exception`, the `{% generation %}` tag, and values printed as
//! Python's `str()` prints them (`None`, `True`, `['a', 1]`).

use std::fmt::Write as _;

use minijinja::value::{Kwargs, ValueKind};
use minijinja::{Error, ErrorKind, Output, State, Value};

use crate::calendar::{civil_from_days, days_from_civil};

/// What a template's own `raise_exception(message)` raised: shown to the user as the
/// template's message (e.g. "System role not supported").
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Raised(pub String);

impl std::fmt::Display for Raised {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Raised {}

pub fn raise_exception(message: String) -> Result<Value, Error> {
    Err(Error::new(ErrorKind::InvalidOperation, "the template raised an exception").with_source(Raised(message)))
}

/// The [`Raised`] message in a render error's chain, if the template raised it.
pub fn raised(error: &Error) -> Option<&Raised> {
    let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(error);
    while let Some(e) = cause {
        if let Some(r) = e.downcast_ref::<Raised>() {
            return Some(r);
        }
        cause = e.source();
    }
    None
}

/// transformers' `{% generation %}…{% endgeneration %}` (it marks the assistant's tokens
/// for training masks and renders its body unchanged) as `{% if true %}…{% endif %}`,
/// keeping the tags' whitespace control (`{%-`, `-%}`) so trim and lstrip act the same.
pub fn rewrite_generation_tags(source: &str) -> String {
    let mut out = String::with_capacity(source.len());
    let mut rest = source;
    while let Some(at) = rest.find("{%") {
        out.push_str(&rest[..at]);
        let tag = &rest[at..];
        match generation_tag(tag) {
            Some((len, open_mark, end, close_mark)) => {
                let body = if end { "endif" } else { "if true" };
                let _ = write!(out, "{{%{open_mark} {body} {close_mark}%}}");
                rest = &tag[len..];
            }
            None => {
                out.push_str("{%");
                rest = &tag[2..];
            }
        }
    }
    out.push_str(rest);
    out
}

/// `{%[-+] (end)generation [-+]%}` at the start of `s`: its length, its opening and
/// closing whitespace marks, and whether it ends the block.
fn generation_tag(s: &str) -> Option<(usize, &str, bool, &str)> {
    let mut i = 2;
    let mark = |i: usize| match s.as_bytes().get(i) {
        Some(b'-') | Some(b'+') => 1,
        _ => 0,
    };
    let open_mark = &s[i..i + mark(i)];
    i += open_mark.len();
    i += s[i..].len() - s[i..].trim_start().len();
    let (end, word_len) = if s[i..].starts_with("endgeneration") {
        (true, "endgeneration".len())
    } else if s[i..].starts_with("generation") {
        (false, "generation".len())
    } else {
        return None;
    };
    i += word_len;
    let spaces = s[i..].len() - s[i..].trim_start().len();
    if spaces == 0 && !s[i..].starts_with(['-', '+', '%']) {
        return None; // a longer name, e.g. `generation_prompt`
    }
    i += spaces;
    let close_mark = &s[i..i + mark(i)];
    i += close_mark.len();
    s[i..].starts_with("%}").then_some((i + 2, open_mark, end, close_mark))
}

/// transformers' `tojson`: `json.dumps(x, ensure_ascii=False, indent=indent,
/// separators=separators, sort_keys=sort_keys)`, so no HTML escaping and Python's spacing
/// (`{"a": 1, "b": [1, 2]}`). Positional arguments follow Python's order.
pub fn tojson(
    value: &Value,
    ensure_ascii: Option<bool>,
    indent: Option<Value>,
    kwargs: Kwargs,
) -> Result<Value, Error> {
    let ensure_ascii = kwargs.get::<Option<bool>>("ensure_ascii")?.or(ensure_ascii).unwrap_or(false);
    let indent = kwargs.get::<Option<Value>>("indent")?.or(indent);
    let separators = kwargs.get::<Option<Value>>("separators")?;
    let sort_keys = kwargs.get::<Option<bool>>("sort_keys")?.unwrap_or(false);
    kwargs.assert_all_used()?;
    let indent = match indent {
        None => None,
        Some(v) if v.is_none() => None,
        Some(v) => match v.as_str() {
            Some(s) => Some(s.to_string()),
            None => Some(" ".repeat(i64::try_from(v)?.max(0) as usize)),
        },
    };
    let (item_sep, key_sep) = match separators {
        Some(s) if !s.is_none() => {
            let parts: Vec<String> = s.try_iter()?.map(|p| p.to_string()).collect();
            match parts.as_slice() {
                [item, key] => (item.clone(), key.clone()),
                _ => return Err(Error::new(ErrorKind::InvalidOperation, "separators must be a pair")),
            }
        }
        _ if indent.is_some() => (",".to_string(), ": ".to_string()),
        _ => (", ".to_string(), ": ".to_string()),
    };
    let json = Json { ensure_ascii, indent, item_sep, key_sep, sort_keys };
    let mut out = String::new();
    json.write(&mut out, value, 0)?;
    Ok(Value::from(out))
}

struct Json {
    ensure_ascii: bool,
    indent: Option<String>,
    item_sep: String,
    key_sep: String,
    sort_keys: bool,
}

impl Json {
    fn write(&self, out: &mut String, value: &Value, depth: usize) -> Result<(), Error> {
        match value.kind() {
            ValueKind::Undefined | ValueKind::None => out.push_str("null"),
            ValueKind::Bool => out.push_str(if value.is_true() { "true" } else { "false" }),
            ValueKind::Number => out.push_str(&py_number(value)),
            ValueKind::Seq | ValueKind::Iterable => {
                let items: Vec<Value> = value.try_iter()?.collect();
                self.container(out, '[', ']', items.len(), depth, |out, i| self.write(out, &items[i], depth + 1))?;
            }
            ValueKind::Map => {
                let mut entries: Vec<(String, Value)> = value
                    .try_iter()?
                    .map(|k| {
                        let v = value.get_item(&k).unwrap_or_default();
                        (py_key(&k), v)
                    })
                    .collect();
                if self.sort_keys {
                    entries.sort_by(|a, b| a.0.cmp(&b.0));
                }
                self.container(out, '{', '}', entries.len(), depth, |out, i| {
                    json_string(out, &entries[i].0, self.ensure_ascii);
                    out.push_str(&self.key_sep);
                    self.write(out, &entries[i].1, depth + 1)
                })?;
            }
            _ => json_string(out, &value.to_string(), self.ensure_ascii),
        }
        Ok(())
    }

    fn container(
        &self,
        out: &mut String,
        open: char,
        close: char,
        len: usize,
        depth: usize,
        mut item: impl FnMut(&mut String, usize) -> Result<(), Error>,
    ) -> Result<(), Error> {
        out.push(open);
        if len == 0 {
            out.push(close);
            return Ok(());
        }
        for i in 0..len {
            if i > 0 {
                out.push_str(&self.item_sep);
            }
            if let Some(indent) = &self.indent {
                out.push('\n');
                out.push_str(&indent.repeat(depth + 1));
            }
            item(out, i)?;
        }
        if let Some(indent) = &self.indent {
            out.push('\n');
            out.push_str(&indent.repeat(depth));
        }
        out.push(close);
        Ok(())
    }
}

/// A map key as `json.dumps` writes it (keys become strings).
fn py_key(key: &Value) -> String {
    match key.kind() {
        ValueKind::String => key.to_string(),
        ValueKind::Bool => (if key.is_true() { "true" } else { "false" }).to_string(),
        ValueKind::None | ValueKind::Undefined => "null".to_string(),
        ValueKind::Number => py_number(key),
        _ => key.to_string(),
    }
}

/// A string as `json.dumps` writes it.
fn json_string(out: &mut String, s: &str, ensure_ascii: bool) {
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
            c if (c as u32) < 0x20 || (ensure_ascii && (c as u32) > 0x7e) => {
                let mut units = [0u16; 2];
                for u in c.encode_utf16(&mut units) {
                    let _ = write!(out, "\\u{u:04x}");
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// A number as Python prints it (`1`, `1.0`, `0.5`, `1e+16`).
fn py_number(value: &Value) -> String {
    if let Some(i) = value.as_i64() {
        if !is_float(value) {
            return i.to_string();
        }
    }
    match f64::try_from(value.clone()) {
        Ok(f) => py_float(f),
        Err(_) => value.to_string(),
    }
}

fn is_float(value: &Value) -> bool {
    // minijinja keeps 1.0 a float: its own printing says so.
    let s = value.to_string();
    s.contains('.') || s.contains('e') || s.contains("inf") || s.contains("NaN") || s.contains("nan")
}

fn py_float(f: f64) -> String {
    if f.is_nan() {
        return "NaN".into();
    }
    if f.is_infinite() {
        return if f > 0.0 { "Infinity".into() } else { "-Infinity".into() };
    }
    let abs = f.abs();
    if abs != 0.0 && !(1e-4..1e16).contains(&abs) {
        // Python: shortest digits, exponent with a sign and two digits at least.
        let s = format!("{f:e}");
        let (mantissa, exp) = s.split_once('e').unwrap_or((&s, "0"));
        let exp: i32 = exp.parse().unwrap_or(0);
        let sign = if exp < 0 { '-' } else { '+' };
        return format!("{mantissa}e{sign}{:02}", exp.abs());
    }
    let s = format!("{f}");
    if s.contains('.') {
        s
    } else {
        format!("{s}.0")
    }
}

/// A value as Python's `str()` writes it: what `{{ x }}` prints in jinja2.
pub fn py_str(value: &Value) -> String {
    match value.kind() {
        ValueKind::Undefined => String::new(),
        ValueKind::String => value.as_str().unwrap_or_default().to_string(),
        _ => py_repr(value),
    }
}

/// A value as Python's `repr()` writes it (inside lists and dicts).
fn py_repr(value: &Value) -> String {
    match value.kind() {
        ValueKind::Undefined => String::new(),
        ValueKind::None => "None".into(),
        ValueKind::Bool => (if value.is_true() { "True" } else { "False" }).into(),
        ValueKind::Number => match py_number(value).as_str() {
            "NaN" => "nan".into(),
            "Infinity" => "inf".into(),
            "-Infinity" => "-inf".into(),
            s => s.into(),
        },
        ValueKind::String => py_repr_str(value.as_str().unwrap_or_default()),
        ValueKind::Seq | ValueKind::Iterable => match value.try_iter() {
            Ok(items) => format!("[{}]", items.map(|v| py_repr(&v)).collect::<Vec<_>>().join(", ")),
            Err(_) => value.to_string(),
        },
        ValueKind::Map => match value.try_iter() {
            Ok(keys) => {
                let entries: Vec<String> = keys
                    .map(|k| format!("{}: {}", py_repr(&k), py_repr(&value.get_item(&k).unwrap_or_default())))
                    .collect();
                format!("{{{}}}", entries.join(", "))
            }
            Err(_) => value.to_string(),
        },
        _ => value.to_string(),
    }
}

/// Python's `repr` of a string: single quotes unless it has one and no double quote.
fn py_repr_str(s: &str) -> String {
    let quote = if s.contains('\'') && !s.contains('"') { '"' } else { '\'' };
    let mut out = String::with_capacity(s.len() + 2);
    out.push(quote);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c == quote => {
                out.push('\\');
                out.push(c);
            }
            c if (c as u32) < 0x20 || c as u32 == 0x7f => {
                let _ = write!(out, "\\x{:02x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push(quote);
    out
}

/// The environment's formatter: what `{{ x }}` writes, as jinja2 (no autoescape) does.
pub fn format_value(out: &mut Output, _state: &State, value: &Value) -> Result<(), Error> {
    out.write_str(&py_str(value)).map_err(Error::from)
}

/// jinja2's `string` filter: `str(x)`.
pub fn string_filter(value: &Value) -> Value {
    Value::from(py_str(value))
}

/// jinja2's `iterable` test: `None` is not (minijinja iterates it as empty), so
/// `tools is iterable and tools | length > 0` works with `tools=None`.
pub fn is_iterable(value: &Value) -> bool {
    !value.is_none() && value.try_iter().is_ok()
}

/// Seconds since 1970 and the local time zone's offset, for `strftime_now`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Instant {
    pub unix_seconds: i64,
    pub utc_offset_seconds: i64,
}

impl Instant {
    /// Now, in the local time zone where the platform says it (Unix), else UTC.
    pub fn now() -> Instant {
        let unix_seconds =
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs() as i64).unwrap_or(0);
        Instant { unix_seconds, utc_offset_seconds: local_offset(unix_seconds) }
    }

    /// A civil date and time, as Python's naive `datetime(y, m, d, H, M, S)`.
    pub fn civil(year: i64, month: u32, day: u32, hour: u32, minute: u32, second: u32) -> Instant {
        let days = days_from_civil(year, month, day);
        let unix_seconds = days * 86_400 + i64::from(hour * 3600 + minute * 60 + second);
        Instant { unix_seconds, utc_offset_seconds: 0 }
    }

    /// `YYYY-MM-DD` or `YYYY-MM-DDTHH:MM[:SS]` (a civil time, as [`civil`](Self::civil)).
    pub fn from_iso(s: &str) -> Option<Instant> {
        let (date, time) = s.split_once(['T', ' ']).unwrap_or((s, "00:00:00"));
        let d: Vec<&str> = date.split('-').collect();
        let t: Vec<&str> = time.split(':').collect();
        if d.len() != 3 || !(2..=3).contains(&t.len()) {
            return None;
        }
        let (month, day) = (d[1].parse().ok()?, d[2].parse().ok()?);
        let (hour, minute) = (t[0].parse().ok()?, t[1].parse().ok()?);
        let second = t.get(2).map_or(Some(0), |s| s.parse().ok())?;
        let valid = (1..=12).contains(&month) && (1..=31).contains(&day) && hour < 24 && minute < 60 && second < 60;
        let year = d[0].parse().ok()?;
        valid.then(|| Instant::civil(year, month, day, hour, minute, second))
    }

    /// Python's `datetime.strftime(format)` for the C locale's codes.
    pub fn strftime(&self, format: &str) -> String {
        const DAYS: [&str; 7] = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"];
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
        let t = self.unix_seconds + self.utc_offset_seconds;
        let days = t.div_euclid(86_400);
        let secs = t.rem_euclid(86_400);
        let (year, month, day) = civil_from_days(days);
        let (hour, minute, second) = (secs / 3600, secs / 60 % 60, secs % 60);
        let weekday = (days + 3).rem_euclid(7) as usize; // 1970-01-01 was a Thursday; 0 = Monday
        let yday = days - days_from_civil(year, 1, 1) + 1;
        let hour12 = if hour % 12 == 0 { 12 } else { hour % 12 };
        let mut out = String::new();
        let mut chars = format.chars();
        while let Some(c) = chars.next() {
            if c != '%' {
                out.push(c);
                continue;
            }
            let _ = match chars.next() {
                Some('Y') => write!(out, "{year}"),
                Some('y') => write!(out, "{:02}", year.rem_euclid(100)),
                Some('m') => write!(out, "{month:02}"),
                Some('d') => write!(out, "{day:02}"),
                Some('e') => write!(out, "{day:2}"),
                Some('H') => write!(out, "{hour:02}"),
                Some('I') => write!(out, "{hour12:02}"),
                Some('M') => write!(out, "{minute:02}"),
                Some('S') => write!(out, "{second:02}"),
                Some('p') => write!(out, "{}", if hour < 12 { "AM" } else { "PM" }),
                Some('j') => write!(out, "{yday:03}"),
                Some('A') => write!(out, "{}", DAYS[weekday]),
                Some('a') => write!(out, "{}", &DAYS[weekday][..3]),
                Some('B') => write!(out, "{}", MONTHS[month as usize - 1]),
                Some('b') | Some('h') => write!(out, "{}", &MONTHS[month as usize - 1][..3]),
                Some('u') => write!(out, "{}", weekday + 1),
                Some('w') => write!(out, "{}", (weekday + 1) % 7),
                Some('F') => write!(out, "{year}-{month:02}-{day:02}"),
                Some('T') => write!(out, "{hour:02}:{minute:02}:{second:02}"),
                Some('%') => write!(out, "%"),
                Some(other) => write!(out, "%{other}"),
                None => write!(out, "%"),
            };
        }
        out
    }
}

#[cfg(unix)]
fn local_offset(unix_seconds: i64) -> i64 {
    let t = unix_seconds as libc::time_t;
    // SAFETY: localtime_r only writes the `tm` we hand it.
    let mut tm: libc::tm = unsafe { std::mem::zeroed() };
    match unsafe { libc::localtime_r(&t, &mut tm) }.is_null() {
        true => 0,
        // `c_long`: 32 bits on 32-bit targets.
        #[allow(clippy::useless_conversion)]
        false => i64::from(tm.tm_gmtoff),
    }
}

#[cfg(not(unix))]
fn local_offset(_unix_seconds: i64) -> i64 {
    0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strftime_matches_python() {
        let t = Instant::civil(2026, 3, 5, 9, 7, 3);
        assert_eq!(t.strftime("%d %b %Y"), "05 Mar 2026");
        assert_eq!(t.strftime("%B %d, %Y"), "March 05, 2026");
        assert_eq!(t.strftime("%Y-%m-%d %H:%M:%S %A %a %j %I%p %%"), "2026-03-05 09:07:03 Thursday Thu 064 09AM %");
        assert_eq!(Instant::civil(2024, 2, 29, 23, 0, 0).strftime("%F %T %a"), "2024-02-29 23:00:00 Thu");
        assert_eq!(Instant::from_iso("2026-03-05T09:07:03"), Some(t));
        assert_eq!(Instant::from_iso("2026-03-05"), Some(Instant::civil(2026, 3, 5, 0, 0, 0)));
        assert_eq!(Instant::from_iso("2026-13-05"), None);
    }

    #[test]
    fn generation_tags_become_ifs_with_their_whitespace_marks() {
        let src = "a{%- generation %}b{% endgeneration -%} {% generation_x %}{%+generation+%}";
        assert_eq!(rewrite_generation_tags(src), "a{%- if true %}b{% endif -%} {% generation_x %}{%+ if true +%}");
    }

    #[test]
    fn python_reprs() {
        let v = Value::from_serialize(serde_json::json!({"a": [1, 2.5, null, true, "it's"], "b": "x"}));
        assert_eq!(py_str(&v), "{'a': [1, 2.5, None, True, \"it's\"], 'b': 'x'}");
        assert_eq!(py_float(1.0), "1.0");
        assert_eq!(py_float(1e16), "1e+16");
    }
}
