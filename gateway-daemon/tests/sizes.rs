//! The house rule, checked: no source file of the daemon, the kernel program or
//! `gateway-common` over 600 lines, no function over 120 (from its `fn` line to its
//! closing brace). A file that grows past it is split by concern, a function into named
//! stages. (In kernel code a split can change the generated program: compare the
//! object's program sections, or run a same-run `cargo xtask bench datapath`.)

use std::path::{Path, PathBuf};

const MAX_FILE_LINES: usize = 600;
const MAX_FN_LINES: usize = 120;

fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("a source directory") {
        let path = entry.expect("a directory entry").path();
        if path.is_dir() {
            sources(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// `src` with comments, strings and character literals blanked (newlines kept), so
/// that braces in them are not counted.
fn code_only(src: &str) -> String {
    let b = src.as_bytes();
    let mut out = String::with_capacity(src.len());
    let blank = |out: &mut String, s: &str| {
        out.extend(s.chars().map(|c| if c == '\n' { '\n' } else { ' ' }));
    };
    let mut i = 0;
    while i < b.len() {
        let rest = &src[i..];
        let word_before = i > 0 && (b[i - 1].is_ascii_alphanumeric() || b[i - 1] == b'_');
        let end = if rest.starts_with("//") {
            rest.find('\n').unwrap_or(rest.len())
        } else if rest.starts_with("/*") {
            rest.find("*/").map_or(rest.len(), |e| e + 2)
        } else if let Some(hashes) = raw_string_hashes(rest).filter(|_| !word_before) {
            let open = rest.find('"').expect("a raw string's quote") + 1;
            let close = format!("\"{}", "#".repeat(hashes));
            rest[open..]
                .find(&close)
                .map_or(rest.len(), |e| open + e + close.len())
        } else if rest.starts_with('"') {
            let mut j = 1;
            while j < rest.len() && rest.as_bytes()[j] != b'"' {
                j += if rest.as_bytes()[j] == b'\\' { 2 } else { 1 };
            }
            (j + 1).min(rest.len())
        } else if rest.starts_with('\'') {
            char_literal_len(rest).unwrap_or(0)
        } else {
            0
        };
        if end > 0 {
            blank(&mut out, &rest[..end]);
            i += end;
        } else {
            let c = rest.chars().next().expect("a character");
            out.push(c);
            i += c.len_utf8();
        }
    }
    out
}

/// The `#`s of a raw string (`r"`, `r#"`, `br"`) starting `s`, if one does.
fn raw_string_hashes(s: &str) -> Option<usize> {
    let s = s.strip_prefix('b').unwrap_or(s).strip_prefix('r')?;
    let hashes = s.len() - s.trim_start_matches('#').len();
    s[hashes..].starts_with('"').then_some(hashes)
}

/// The length of a character literal starting `s` (not a lifetime).
fn char_literal_len(s: &str) -> Option<usize> {
    let b = s.as_bytes();
    if b.get(1) == Some(&b'\\') {
        return s[2..].find('\'').map(|e| e + 3);
    }
    let c = s[1..].chars().next()?;
    (s[1 + c.len_utf8()..].starts_with('\'')).then_some(2 + c.len_utf8())
}

/// Every function with a body in `code`: (name, first line, lines).
fn functions(code: &str) -> Vec<(String, usize, usize)> {
    let lines: Vec<&str> = code.lines().collect();
    let mut out = Vec::new();
    for (n, line) in lines.iter().enumerate() {
        let Some(at) = fn_keyword(line) else {
            continue;
        };
        let name: String = line[at + 3..]
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect();
        // The body: the first `{` before a `;` outside brackets (a declaration has
        // none; `[T; 30]` in a signature is no end), to its match.
        let mut depth = 0usize;
        let mut brackets = 0usize;
        let mut opened = false;
        'lines: for (m, l) in lines.iter().enumerate().skip(n) {
            let from = if m == n { at } else { 0 };
            for c in l[from..].chars() {
                match c {
                    '(' | '[' if !opened => brackets += 1,
                    ')' | ']' if !opened => brackets = brackets.saturating_sub(1),
                    ';' if !opened && brackets == 0 => break 'lines,
                    '{' => {
                        opened = true;
                        depth += 1;
                    }
                    '}' if opened => {
                        depth -= 1;
                        if depth == 0 {
                            out.push((name.clone(), n + 1, m - n + 1));
                            break 'lines;
                        }
                    }
                    _ => {}
                }
            }
        }
    }
    out
}

/// Where `fn ` starts a function item on `line`, if it does.
fn fn_keyword(line: &str) -> Option<usize> {
    let at = line.find("fn ")?;
    let before = line[..at].trim();
    let item = before.is_empty()
        || before.split_whitespace().all(|w| {
            matches!(w, "pub" | "const" | "async" | "unsafe" | "extern" | "\"C\"")
                || w.starts_with("pub(")
        });
    item.then_some(at)
}

#[test]
fn no_file_over_600_lines_and_no_function_over_120() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut files = Vec::new();
    for dir in [
        "gateway-daemon/src",
        "gateway-ebpf/src",
        "gateway-common/src",
    ] {
        sources(&root.join(dir), &mut files);
    }
    assert!(files.len() > 100, "found {} source files", files.len());
    let mut over = Vec::new();
    for path in &files {
        let rel = path
            .strip_prefix(&root)
            .unwrap_or(path)
            .to_string_lossy()
            .into_owned();
        let src = std::fs::read_to_string(path).expect("a source file");
        let lines = src.lines().count();
        if lines > MAX_FILE_LINES {
            over.push(format!("{rel}: {lines} lines"));
        }
        for (name, line, len) in functions(&code_only(&src)) {
            if len > MAX_FN_LINES {
                over.push(format!("{rel}:{line}: fn {name} is {len} lines"));
            }
        }
    }
    assert!(over.is_empty(), "over the limits:\n{}", over.join("\n"));
}

#[test]
fn the_counter_sees_functions_past_braces_in_strings_comments_and_chars() {
    let src = "fn a() {\n    let s = \"}\"; // }\n    let c = '}';\n    let r = r#\"{\"#;\n}\nfn b();\npub(crate) fn c<'x>(v: &'x str) -> [u8; 2] {\n    v\n}\n";
    let found = functions(&code_only(src));
    assert_eq!(
        found,
        [("a".to_string(), 1, 5), ("c".to_string(), 7, 3)],
        "{found:?}"
    );
}
