//! Quoting for terminals: everything fencefs shows a person (`approve`, `ctl`, `explain`,
//! log lines) that may carry a caller's bytes goes through here, so that no byte from a
//! caller reaches a terminal raw.
//!
//! Pure. The rules are git's for paths (`core.quotePath`), except that valid printable
//! UTF-8 passes unchanged:
//! - A text that needs no quoting is returned as it is. Otherwise it is wrapped in double
//!   quotes, with C escapes `\a \b \t \n \v \f \r \" \\`, and `\ooo` (three octal digits)
//!   for every other byte that must not reach a terminal: the C0 controls, DEL, and every
//!   byte of invalid UTF-8.
//! - Valid UTF-8 characters that a terminal would act on or that can change what a person
//!   sees are written as the octal of each of their UTF-8 bytes (as git does for every
//!   non-ASCII byte): the C1 controls U+0080–U+009F (U+009B is a CSI on some terminals),
//!   the Unicode format characters (category Cf: bidi embeddings, overrides and isolates
//!   U+202A–U+202E and U+2066–U+2069, LRM/RLM/ALM, zero-width characters, the BOM, tag
//!   characters…) and the line and paragraph separators U+2028/U+2029.
//! - `"` and `\` make a text need quoting (so the quoted form is unambiguous), like git.
//!
//! [`quote`] is the one function; [`escape`] is the same escaping without the surrounding
//! quotes, for a whole message in which caller bytes are embedded; [`text`] keeps newlines
//! and tabs too, for contents shown as lines (`stage diff` on a terminal); [`json_safe`] applies
//! the same classification to JSON text (every character that must not reach a terminal
//! becomes `\uXXXX`, so the output stays valid JSON with the same meaning).

use std::borrow::Cow;

/// Format characters (Unicode category Cf) and the line/paragraph separators: ranges,
/// inclusive. Any of them can reorder, hide or break what a person reads.
const INVISIBLE: &[(u32, u32)] = &[
    (0x00AD, 0x00AD),   // soft hyphen
    (0x0600, 0x0605),   // Arabic number signs
    (0x061C, 0x061C),   // Arabic letter mark (bidi)
    (0x06DD, 0x06DD),   // Arabic end of ayah
    (0x070F, 0x070F),   // Syriac abbreviation mark
    (0x0890, 0x0891),   // Arabic pound/piastre mark above
    (0x08E2, 0x08E2),   // Arabic disputed end of ayah
    (0x180E, 0x180E),   // Mongolian vowel separator
    (0x200B, 0x200F),   // zero width space/joiners, LRM, RLM
    (0x2028, 0x202E),   // line/paragraph separators, bidi embeddings and overrides
    (0x2060, 0x2064),   // word joiner, invisible operators
    (0x2066, 0x206F),   // bidi isolates, deprecated format characters
    (0xFEFF, 0xFEFF),   // BOM / zero width no-break space
    (0xFFF9, 0xFFFB),   // interlinear annotation
    (0x110BD, 0x110BD), // Kaithi number sign
    (0x110CD, 0x110CD),
    (0x13430, 0x1343F), // Egyptian hieroglyph format controls
    (0x1BCA0, 0x1BCA3), // shorthand format controls
    (0x1D173, 0x1D17A), // musical symbol format controls
    (0xE0001, 0xE0001), // language tag
    (0xE0020, 0xE007F), // tag characters
];

/// Whether `c` must not reach a terminal as it is.
pub fn unsafe_char(c: char) -> bool {
    let u = c as u32;
    u < 0x20 || (0x7F..=0x9F).contains(&u) || INVISIBLE.iter().any(|&(a, b)| (a..=b).contains(&u))
}

fn push_octal(out: &mut String, b: u8) {
    out.push('\\');
    out.push(char::from(b'0' + (b >> 6)));
    out.push(char::from(b'0' + ((b >> 3) & 7)));
    out.push(char::from(b'0' + (b & 7)));
}

fn push_escaped_char(out: &mut String, c: char) {
    match c {
        '\x07' => out.push_str("\\a"),
        '\x08' => out.push_str("\\b"),
        '\t' => out.push_str("\\t"),
        '\n' => out.push_str("\\n"),
        '\x0b' => out.push_str("\\v"),
        '\x0c' => out.push_str("\\f"),
        '\r' => out.push_str("\\r"),
        '"' => out.push_str("\\\""),
        '\\' => out.push_str("\\\\"),
        c if unsafe_char(c) => {
            let mut b = [0u8; 4];
            for &x in c.encode_utf8(&mut b).as_bytes() {
                push_octal(out, x);
            }
        }
        c => out.push(c),
    }
}

/// Appends `bytes` escaped (no surrounding quotes).
fn escape_into(out: &mut String, bytes: &[u8]) {
    for chunk in bytes.utf8_chunks() {
        for c in chunk.valid().chars() {
            push_escaped_char(out, c);
        }
        for &b in chunk.invalid() {
            push_octal(out, b);
        }
    }
}

/// Whether `bytes` must be quoted: invalid UTF-8, an unsafe character, `"` or `\`.
pub fn needs_quoting(bytes: &[u8]) -> bool {
    match std::str::from_utf8(bytes) {
        Ok(s) => s.chars().any(|c| c == '"' || c == '\\' || unsafe_char(c)),
        Err(_) => true,
    }
}

/// `bytes` as a person may see it: unchanged when it is printable UTF-8 without `"` or
/// `\`, else in double quotes with git's escapes (see the module's header).
pub fn quote(bytes: &[u8]) -> Cow<'_, str> {
    if !needs_quoting(bytes) {
        // needs_quoting checked it is UTF-8.
        return Cow::Borrowed(std::str::from_utf8(bytes).unwrap_or_default());
    }
    let mut out = String::with_capacity(bytes.len() + 8);
    out.push('"');
    escape_into(&mut out, bytes);
    out.push('"');
    Cow::Owned(out)
}

/// `bytes` quoted exactly as git quotes a path in a diff (`core.quotePath`, its default):
/// like [`quote`], with the same escapes, but every byte outside printable ASCII is
/// written in octal, valid UTF-8 too (so `git apply` and `patch` read the same name).
pub fn quote_git(bytes: &[u8]) -> Cow<'_, str> {
    let plain = bytes
        .iter()
        .all(|&b| (0x20..0x7f).contains(&b) && b != b'"' && b != b'\\');
    if plain {
        // Printable ASCII only: valid UTF-8.
        return Cow::Borrowed(std::str::from_utf8(bytes).unwrap_or_default());
    }
    let mut out = String::with_capacity(bytes.len() + 8);
    out.push('"');
    for &b in bytes {
        if b.is_ascii() {
            push_escaped_char(&mut out, char::from(b));
        } else {
            push_octal(&mut out, b);
        }
    }
    out.push('"');
    Cow::Owned(out)
}

/// A whole message with caller bytes in it, made safe for a terminal: unsafe characters
/// and invalid UTF-8 escaped as [`quote`] does, but no quotes added and `"`/`\` kept.
pub fn escape(bytes: &[u8]) -> Cow<'_, str> {
    match std::str::from_utf8(bytes) {
        Ok(s) if !s.chars().any(unsafe_char) => Cow::Borrowed(s),
        _ => {
            let mut out = String::with_capacity(bytes.len() + 8);
            for chunk in bytes.utf8_chunks() {
                for c in chunk.valid().chars() {
                    if unsafe_char(c) {
                        push_escaped_char(&mut out, c);
                    } else {
                        out.push(c);
                    }
                }
                for &b in chunk.invalid() {
                    push_octal(&mut out, b);
                }
            }
            Cow::Owned(out)
        }
    }
}

/// Text shown as lines on a terminal (a diff's contents): like [`escape`], but newlines and
/// tabs are kept, since they only move the cursor down or to the right.
pub fn text(bytes: &[u8]) -> Cow<'_, str> {
    let keep = |c: char| c == '\n' || c == '\t' || !unsafe_char(c);
    match std::str::from_utf8(bytes) {
        Ok(s) if s.chars().all(keep) => Cow::Borrowed(s),
        _ => {
            let mut out = String::with_capacity(bytes.len() + 8);
            for chunk in bytes.utf8_chunks() {
                for c in chunk.valid().chars() {
                    if keep(c) {
                        out.push(c);
                    } else {
                        push_escaped_char(&mut out, c);
                    }
                }
                for &b in chunk.invalid() {
                    push_octal(&mut out, b);
                }
            }
            Cow::Owned(out)
        }
    }
}

/// A writer for a terminal: every complete line written to it goes to `inner` through
/// [`text`]; the last, unterminated piece on [`flush`](std::io::Write::flush). Memory: one
/// line.
pub struct TextWriter<W: std::io::Write> {
    inner: W,
    line: Vec<u8>,
}

impl<W: std::io::Write> TextWriter<W> {
    pub fn new(inner: W) -> TextWriter<W> {
        TextWriter {
            inner,
            line: Vec::new(),
        }
    }
}

impl<W: std::io::Write> std::io::Write for TextWriter<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let mut rest = buf;
        while let Some(i) = rest.iter().position(|&b| b == b'\n') {
            self.line.extend_from_slice(&rest[..=i]);
            self.inner.write_all(text(&self.line).as_bytes())?;
            self.line.clear();
            rest = &rest[i + 1..];
        }
        self.line.extend_from_slice(rest);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        if !self.line.is_empty() {
            self.inner.write_all(text(&self.line).as_bytes())?;
            self.line.clear();
        }
        self.inner.flush()
    }
}

/// JSON text made safe for a terminal without changing what it means. In valid JSON a
/// control character outside a string can only be whitespace between tokens: newlines are
/// kept, tabs and carriage returns become spaces. Every other character [`unsafe_char`]
/// names can only be inside a string, and becomes a `\uXXXX` escape there (a surrogate
/// pair above U+FFFF).
pub fn json_safe(json: &str) -> Cow<'_, str> {
    let unsafe_in_json = |c: char| c != '\n' && unsafe_char(c);
    if !json.chars().any(unsafe_in_json) {
        return Cow::Borrowed(json);
    }
    let mut out = String::with_capacity(json.len() + 16);
    for c in json.chars() {
        if c == '\t' || c == '\r' {
            out.push(' ');
        } else if unsafe_in_json(c) {
            let mut units = [0u16; 2];
            for u in c.encode_utf16(&mut units) {
                out.push_str(&format!("\\u{u:04x}"));
            }
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

#[cfg(test)]
mod tests {

    #[test]
    fn git_quoting_writes_every_non_ascii_byte_in_octal() {
        assert_eq!(quote_git(b"src/a.rs"), "src/a.rs");
        assert_eq!(quote_git(b"a\tb"), "\"a\\tb\"");
        assert_eq!(quote_git("é".as_bytes()), "\"\\303\\251\"");
        assert_eq!(
            quote_git(b"\xff\x7f\x01\"q\""),
            "\"\\377\\177\\001\\\"q\\\"\""
        );
        assert_eq!(quote_git(b"tab\there"), "\"tab\\there\"");
    }

    use super::*;

    /// The C escape git uses for a C0 byte, if it has one.
    fn c_escape(b: u8) -> Option<&'static str> {
        Some(match b {
            0x07 => "\\a",
            0x08 => "\\b",
            0x09 => "\\t",
            0x0a => "\\n",
            0x0b => "\\v",
            0x0c => "\\f",
            0x0d => "\\r",
            _ => return None,
        })
    }

    #[test]
    fn printable_utf8_passes_unchanged() {
        for s in [
            "docs/a.md",
            "",
            "naïve café/日本語/emoji 🦀",
            "with space and 'single quotes'",
            "עברית ثم العربية", // right-to-left letters are not controls
        ] {
            assert!(!needs_quoting(s.as_bytes()), "{s}");
            assert!(matches!(quote(s.as_bytes()), Cow::Borrowed(x) if x == s));
            assert!(matches!(escape(s.as_bytes()), Cow::Borrowed(x) if x == s));
        }
    }

    #[test]
    fn every_c0_byte_and_del_is_escaped() {
        for b in (0u8..0x20).chain([0x7f]) {
            let input = [b'a', b, b'z'];
            let want = match c_escape(b) {
                Some(e) => format!("\"a{e}z\""),
                None => format!("\"a\\{:03o}z\"", b),
            };
            assert_eq!(quote(&input), want, "byte {b:#04x}");
            let q = quote(&input);
            assert!(q.bytes().all(|x| (0x20..0x7f).contains(&x)), "{q:?}");
            // escape() escapes the same way, without quotes.
            assert_eq!(escape(&input), &want[1..want.len() - 1], "byte {b:#04x}");
        }
    }

    #[test]
    fn every_c1_control_is_escaped_as_utf8_and_as_a_raw_byte() {
        for u in 0x80u32..=0x9f {
            let c = char::from_u32(u).unwrap();
            let s = format!("x{c}y");
            let mut b = [0u8; 2];
            c.encode_utf8(&mut b);
            assert_eq!(
                quote(s.as_bytes()),
                format!("\"x\\{:03o}\\{:03o}y\"", b[0], b[1]),
                "U+{u:04X}"
            );
            // The same value as a lone byte is invalid UTF-8: its octal.
            assert_eq!(quote(&[b'x', u as u8, b'y']), format!("\"x\\{u:03o}y\""));
            assert!(json_safe(&s).is_ascii());
            assert_eq!(json_safe(&s), format!("x\\u{u:04x}y"));
        }
    }

    #[test]
    fn every_byte_of_invalid_utf8_is_octal() {
        let cases: &[(&[u8], &str)] = &[
            (b"\xff", "\"\\377\""),
            (b"a\xc3", "\"a\\303\""),                 // truncated sequence
            (b"\xe2\x80", "\"\\342\\200\""),          // truncated 3-byte sequence
            (b"\xc0\xaf", "\"\\300\\257\""),          // overlong '/'
            (b"\xed\xa0\x80", "\"\\355\\240\\200\""), // a surrogate
            (b"ok\xf8\x88\x80\x80\x80", "\"ok\\370\\210\\200\\200\\200\""),
        ];
        for (input, want) in cases {
            assert!(needs_quoting(input));
            assert_eq!(quote(input), *want, "{input:?}");
        }
        // Every high byte alone.
        for b in 0x80u8..=0xff {
            assert_eq!(quote(&[b]), format!("\"\\{b:03o}\""));
        }
    }

    #[test]
    fn bidi_and_format_controls_are_escaped() {
        for u in [
            0x202Au32, 0x202B, 0x202C, 0x202D, 0x202E, 0x2066, 0x2067, 0x2068, 0x2069, 0x200E,
            0x200F, 0x061C, 0x200B, 0x200D, 0x2028, 0x2029, 0xFEFF, 0xE0041, 0x00AD,
        ] {
            let c = char::from_u32(u).unwrap();
            let s = format!("a{c}b");
            let q = quote(s.as_bytes());
            assert!(q.is_ascii(), "U+{u:04X}: {q}");
            let mut b = [0u8; 4];
            let octal: String = c
                .encode_utf8(&mut b)
                .bytes()
                .map(|x| format!("\\{x:03o}"))
                .collect();
            assert_eq!(q, format!("\"a{octal}b\""), "U+{u:04X}");
            assert!(json_safe(&s).is_ascii());
        }
        // U+202E between "abc" and "fdp.exe" would show "abcexe.pdf".
        assert_eq!(
            quote("abc\u{202e}fdp.exe".as_bytes()),
            "\"abc\\342\\200\\256fdp.exe\""
        );
        assert_eq!(json_safe("\u{1F980}\u{E0041}"), "\u{1F980}\\udb40\\udc41");
    }

    #[test]
    fn quotes_and_backslashes_quote_like_git() {
        assert_eq!(quote(b"a\"b"), "\"a\\\"b\"");
        assert_eq!(quote(b"s/\\./x/"), "\"s/\\\\./x/\"");
        // escape() keeps them: it only removes what a terminal would act on.
        assert_eq!(escape(b"a\"b\\"), "a\"b\\");
    }

    #[test]
    fn terminal_attacks_come_out_inert() {
        let attack = b"\x1b[2K\x1b[1A\rallow docs/notes-draft.md\x1b]0;t\x07\xc2\x9b31m";
        let q = quote(attack);
        assert_eq!(
            q,
            "\"\\033[2K\\033[1A\\rallow docs/notes-draft.md\\033]0;t\\a\\302\\23331m\""
        );
        assert!(q.bytes().all(|b| (0x20..0x7f).contains(&b)));
        let j = serde_json::to_string(&String::from_utf8_lossy(attack)).unwrap();
        let safe = json_safe(&j);
        assert!(safe.bytes().all(|b| (0x20..0x7f).contains(&b)), "{safe}");
        let back: String = serde_json::from_str(&safe).unwrap();
        assert_eq!(back.as_bytes(), String::from_utf8_lossy(attack).as_bytes());
        // Pretty JSON keeps its lines and stays the same JSON.
        let v = serde_json::json!({"held": [{"paths": [back], "x": "\u{202e}"}]});
        let pretty = serde_json::to_string_pretty(&v).unwrap();
        let safe = json_safe(&pretty);
        assert_eq!(safe.lines().count(), pretty.lines().count());
        assert!(
            safe.bytes()
                .all(|b| b == b'\n' || (0x20..0x7f).contains(&b)),
            "{safe}"
        );
        assert_eq!(serde_json::from_str::<serde_json::Value>(&safe).unwrap(), v);
        assert_eq!(json_safe("{\t\"a\":\r1}"), "{ \"a\": 1}");
    }

    #[test]
    fn text_keeps_lines_and_tabs_and_escapes_the_rest() {
        assert!(matches!(text(b"a\tb\nc\n"), Cow::Borrowed("a\tb\nc\n")));
        assert_eq!(
            text("x\x1b[2K\ry\u{9b}\u{202e}\n".as_bytes()),
            "x\\033[2K\\ry\\302\\233\\342\\200\\256\n"
        );
        assert_eq!(text(b"\xff\n"), "\\377\n");
        use std::io::Write;
        let mut w = TextWriter::new(Vec::new());
        // A character split across writes is still one character.
        w.write_all("a\u{202e}".as_bytes()[..2].as_ref()).unwrap();
        w.write_all(&"a\u{202e}".as_bytes()[2..]).unwrap();
        w.write_all(b"\nend\x07").unwrap();
        w.flush().unwrap();
        assert_eq!(w.inner, b"a\\342\\200\\256\nend\\a");
    }
}
