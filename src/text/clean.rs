//! [`Cleaner`]: newline normalisation, control characters, whitespace, trimming, NFC.

use unicode_normalization::{is_nfc_quick, IsNormalized, UnicodeNormalization};

/// Text cleaning, one pass per string (plus NFC where the string is not already NFC).
///
/// In order: line breaks (`\r\n`, `\r`, U+0085, U+2028, U+2029) become `\n`; control
/// characters other than `\n` and `\t` are removed, and so are the invisible format characters
/// U+200B (zero width space), U+2060 (word joiner) and U+FEFF (byte-order mark); with
/// `collapse_whitespace`, runs of horizontal whitespace become one space, whitespace at the start
/// and end of every line goes, and more than one blank line in a row becomes one; the result is NFC-normalised; `trim`
/// strips leading and trailing whitespace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Cleaner {
    /// Normalise line breaks to `\n` (default on).
    pub normalize_newlines: bool,
    /// Remove control and invisible format characters (default on).
    pub strip_control: bool,
    /// Collapse whitespace runs and blank lines (default off).
    pub collapse_whitespace: bool,
    /// Unicode NFC (default on).
    pub nfc: bool,
    /// Strip leading / trailing whitespace (default on).
    pub trim: bool,
}

impl Default for Cleaner {
    fn default() -> Cleaner {
        Cleaner { normalize_newlines: true, strip_control: true, collapse_whitespace: false, nfc: true, trim: true }
    }
}

fn is_break(c: char) -> bool {
    matches!(c, '\r' | '\u{85}' | '\u{2028}' | '\u{2029}')
}

fn is_dropped(c: char) -> bool {
    (c.is_control() && c != '\n' && c != '\t') || matches!(c, '\u{200B}' | '\u{2060}' | '\u{FEFF}')
}

impl Cleaner {
    /// Clean `text` into `out` (cleared first). Returns false when the result equals `text`
    /// (then `out` is unspecified and the caller keeps the original).
    pub fn clean_into(&self, text: &str, out: &mut String) -> bool {
        out.clear();
        if !self.collapse_whitespace {
            return self.clean_runs(text, out);
        }
        if self.is_clean(text) {
            return false;
        }
        let mut chars = text.chars().peekable();
        // Pending horizontal whitespace (collapse mode) and blank-line count.
        let mut pending_space = false;
        let mut newlines = 0usize;
        while let Some(c) = chars.next() {
            let c = if self.normalize_newlines && is_break(c) {
                if c == '\r' && chars.peek() == Some(&'\n') {
                    chars.next();
                }
                '\n'
            } else {
                c
            };
            if self.strip_control && is_dropped(c) {
                continue;
            }
            if !self.collapse_whitespace {
                out.push(c);
                continue;
            }
            if c == '\n' {
                pending_space = false;
                newlines += 1;
                continue;
            }
            if c.is_whitespace() {
                pending_space = true;
                continue;
            }
            if newlines > 0 {
                out.push_str(if newlines > 1 { "\n\n" } else { "\n" });
                newlines = 0;
            } else if pending_space && !out.is_empty() {
                out.push(' ');
            }
            pending_space = false;
            out.push(c);
        }
        if self.collapse_whitespace && newlines > 0 && !self.trim {
            out.push('\n');
        }
        self.finish(text, out)
    }

    /// Without whitespace collapse: copy runs of ordinary bytes in bulk, handling only the
    /// bytes that change; nothing is copied when nothing changes.
    fn clean_runs(&self, text: &str, out: &mut String) -> bool {
        let b = text.as_bytes();
        let (mut i, mut run) = (0usize, 0usize);
        let mut edited = false;
        while i < b.len() {
            let c = b[i];
            if (0x20..0x7f).contains(&c) || c == b'\n' || c == b'\t' {
                i += 1;
                continue;
            }
            if c < 0x80 {
                // \r, other C0 controls, DEL.
                if c == b'\r' && self.normalize_newlines {
                    out.push_str(&text[run..i]);
                    out.push('\n');
                    if b.get(i + 1) == Some(&b'\n') {
                        i += 1;
                    }
                    edited = true;
                    run = i + 1;
                } else if self.strip_control {
                    out.push_str(&text[run..i]);
                    edited = true;
                    run = i + 1;
                }
                i += 1;
                continue;
            }
            let ch = text[i..].chars().next().unwrap_or('\u{FFFD}');
            let w = ch.len_utf8();
            let brk = self.normalize_newlines && is_break(ch);
            if brk || (self.strip_control && is_dropped(ch)) {
                out.push_str(&text[run..i]);
                if brk {
                    out.push('\n');
                }
                edited = true;
                run = i + w;
            }
            i += w;
        }
        let needs_nfc = |s: &str| self.nfc && !s.is_ascii() && is_nfc_quick(s.chars()) != IsNormalized::Yes;
        if !edited {
            let trimmed = if self.trim { text.trim() } else { text };
            if trimmed.len() == text.len() && !needs_nfc(text) {
                return false;
            }
            out.push_str(text);
        } else {
            out.push_str(&text[run..]);
        }
        self.finish(text, out)
    }

    /// The steps both paths end with: NFC where needed, then trim; true when `out` differs.
    fn finish(&self, text: &str, out: &mut String) -> bool {
        if self.nfc && !out.is_ascii() && is_nfc_quick(out.chars()) != IsNormalized::Yes {
            let n: String = out.nfc().collect();
            *out = n;
        }
        if self.trim {
            let t = out.trim();
            if t.len() != out.len() {
                let start = t.as_ptr() as usize - out.as_ptr() as usize;
                let len = t.len();
                out.truncate(start + len);
                out.drain(..start);
            }
        }
        out != text
    }

    /// Clean one string.
    pub fn clean(&self, text: &str) -> String {
        let mut out = String::new();
        if self.clean_into(text, &mut out) {
            out
        } else {
            text.to_string()
        }
    }

    /// True when cleaning cannot change `text` (checked without building anything): the
    /// common case for already-clean corpora, where the row's view is reused as is.
    fn is_clean(&self, text: &str) -> bool {
        let b = text.as_bytes();
        if self.trim && (b.first().is_some_and(|&c| (c as char).is_whitespace()) || b.last().is_some_and(|&c| (c as char).is_whitespace())) {
            return false;
        }
        if !text.is_ascii() {
            // Non-ASCII: the slower checks below decide.
            return self.is_clean_unicode(text);
        }
        // Collapse treats the start of the text like the start of a line (leading spaces go).
        let mut prev = if self.collapse_whitespace { b'\n' } else { 0u8 };
        for &c in b {
            if ((c < 0x20 && c != b'\n' && c != b'\t') || c == 0x7f) && !(c == b'\r' && !self.normalize_newlines && !self.strip_control) {
                return false;
            }
            if self.collapse_whitespace {
                let ws = |x: u8| x == b' ' || x == b'\t';
                if (ws(c) && (ws(prev) || prev == b'\n')) || c == b'\t' || (c == b'\n' && (ws(prev) || prev == b'\n')) {
                    // Runs, tabs, trailing spaces and blank lines may change; let the full pass decide.
                    return false;
                }
            }
            prev = c;
        }
        // Collapse drops trailing spaces.
        !(self.collapse_whitespace && (prev == b' ' || prev == b'\t'))
    }

    fn is_clean_unicode(&self, text: &str) -> bool {
        if self.trim && text.trim().len() != text.len() {
            return false;
        }
        if self.collapse_whitespace {
            return false;
        }
        for c in text.chars() {
            if (self.normalize_newlines && is_break(c)) || (self.strip_control && is_dropped(c)) {
                return false;
            }
        }
        !self.nfc || is_nfc_quick(text.chars()) == IsNormalized::Yes
    }
}
