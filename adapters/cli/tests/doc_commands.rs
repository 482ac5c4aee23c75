//! Every command the README, the guides (`docs/guide/*.md`), BENCHMARKS.md, REPRODUCTION.md
//! and `adapters/transport/TCP.md` show still works, and every relative link in the docs
//! leads somewhere.
//!
//! Commands: every fenced block tagged `sh` is read line by line (a trailing `\` joins the
//! next line; `&&`, `||`, `|`, `;` and `&` separate commands; `# ...` is a comment) and
//! every `syncopate ...`, `path/to/syncopate ...` or `cargo run ... -p syncopate-adapters
//! -- ...` command in it is checked with [`check_command_line`] without being run: the
//! subcommand and flags exist and every value is valid. `$i` stands for a worker id, 0.
//! Shell commands belong in `sh` blocks; a block that must not be checked says what it is
//! instead (`text` for output or a sketch, `toml`, `rust`, `c`, `python`). A fenced block
//! without a language, or tagged `bash`, `shell` or `console`, fails the test, so nothing is
//! skipped silently.
//!
//! The README's sample output of `compare` is what `compare` prints today, digit for digit.
//!
//! Links: every relative `[text](path)` and `[text](path#anchor)` in README.md, the other
//! top-level docs, `core/WIRE.md`, `adapters/transport/TCP.md` and `docs/**/*.md` names an existing file, and an anchor into a Markdown
//! file names one of its headings.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use syncopate_adapters::cli::check_command_line;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn markdown_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            markdown_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "md") {
            out.push(path);
        }
    }
}

/// The pages whose commands are checked: README.md, the guides, and the other docs that
/// show `syncopate` commands.
fn command_pages() -> Vec<PathBuf> {
    let mut pages: Vec<PathBuf> = ["README.md", "BENCHMARKS.md", "REPRODUCTION.md", "adapters/transport/TCP.md"]
        .iter()
        .map(|p| root().join(p))
        .collect();
    markdown_files(&root().join("docs/guide"), &mut pages);
    pages.sort();
    pages
}

/// A fenced block: its language tag, the line of its opening fence and its lines.
struct Block {
    tag: String,
    line: usize,
    lines: Vec<(usize, String)>,
}

fn fenced_blocks(text: &str) -> Vec<Block> {
    let mut blocks = Vec::new();
    let mut open: Option<Block> = None;
    for (i, line) in text.lines().enumerate() {
        let trimmed = line.trim_start();
        if let Some(rest) = trimmed.strip_prefix("```") {
            match open.take() {
                Some(block) => blocks.push(block),
                None => {
                    let tag = rest.split_whitespace().next().unwrap_or("").to_owned();
                    open = Some(Block { tag, line: i + 1, lines: Vec::new() });
                }
            }
        } else if let Some(block) = open.as_mut() {
            block.lines.push((i + 1, line.to_owned()));
        }
    }
    blocks
}

/// A shell line without its comment (a `#` at the start or after white space, outside quotes).
fn strip_comment(line: &str) -> &str {
    let (mut single, mut double, mut previous) = (false, false, ' ');
    for (i, c) in line.char_indices() {
        match c {
            '\'' if !double => single = !single,
            '"' if !single => double = !double,
            '#' if !single && !double && previous.is_whitespace() => return &line[..i],
            _ => {}
        }
        previous = c;
    }
    line
}

/// The simple commands of a shell line, each as its words (quotes removed).
fn simple_commands(line: &str) -> Vec<Vec<String>> {
    let line = line.replace("2>&1", " ");
    let mut commands = Vec::new();
    let mut words: Vec<String> = Vec::new();
    let mut word = String::new();
    let (mut single, mut double) = (false, false);
    let mut chars = line.chars().peekable();
    let end_word = |word: &mut String, words: &mut Vec<String>| {
        if !word.is_empty() {
            words.push(core::mem::take(word));
        }
    };
    while let Some(c) = chars.next() {
        match c {
            '\'' if !double => single = !single,
            '"' if !single => double = !double,
            c if single || double => word.push(c),
            ' ' | '\t' => end_word(&mut word, &mut words),
            '&' | '|' | ';' | '(' | ')' => {
                if chars.peek() == Some(&c) {
                    chars.next();
                }
                end_word(&mut word, &mut words);
                commands.push(core::mem::take(&mut words));
            }
            c => word.push(c),
        }
    }
    end_word(&mut word, &mut words);
    commands.push(words);
    commands.retain(|c| !c.is_empty());
    commands
}

/// The arguments after the program name when `words` runs the `syncopate` binary.
fn syncopate_args(words: &[String]) -> Option<Vec<String>> {
    if words.first().is_some_and(|w| w == "cargo") {
        if words.get(1).is_none_or(|w| w != "run") {
            return None;
        }
        let package = words.windows(2).any(|p| p[0] == "-p" && p[1] == "syncopate-adapters")
            || words.iter().any(|w| w == "--package=syncopate-adapters" || w == "--bin=syncopate")
            || words.windows(2).any(|p| p[0] == "--bin" && p[1] == "syncopate");
        let dashes = words.iter().position(|w| w == "--")?;
        return package.then(|| words[dashes + 1..].to_vec());
    }
    let program = words.iter().position(|w| Path::new(w).file_name().is_some_and(|name| name == "syncopate"))?;
    Some(words[program + 1..].to_vec())
}

#[test]
fn the_check_refuses_what_the_command_refuses() {
    let check = |line: &str| check_command_line(line.split_whitespace());
    for good in [
        "syncopate compare --preset dbw",
        "syncopate train --protocol ssp --staleness 3 --straggler 0:slow=4 --sim",
        "syncopate work --connect 127.0.0.1:7070 --id 0 --straggler 0:slow=4",
    ] {
        assert_eq!(check(good), Ok(()), "{good}");
    }
    for bad in [
        "syncopate trian --sim",
        "syncopate train --bogus",
        "syncopate train --protocol bsp --staleness 3",
        "syncopate train --workers 4 --straggler 9:slow=4",
        "syncopate train --step-ms 0",
        "syncopate mpi --workers 4 --straggler 0:slow=x",
        "syncopate serve --protocol backup --k-min 2",
        "syncopate compare --preset nope",
        "syncopate advise --trace t.csv --seeds 0",
    ] {
        assert!(check(bad).is_err(), "{bad} passed the check");
    }
}

#[test]
fn every_syncopate_command_in_the_docs_is_valid() {
    // Scenario files in the docs are named from the repository's root.
    std::env::set_current_dir(root()).expect("the repository's root");
    let mut failures = Vec::new();
    let mut checked = 0;
    for page in command_pages() {
        let name = page.strip_prefix(root()).unwrap_or(&page).display().to_string();
        let text = std::fs::read_to_string(&page).expect("a readable page");
        for block in fenced_blocks(&text) {
            match block.tag.as_str() {
                "sh" => {}
                "" | "bash" | "shell" | "console" => {
                    failures.push(format!(
                        "{name}:{}: a fenced block tagged '{}': tag shell commands `sh`, anything else by what it is (`text`, `toml`, ...)",
                        block.line, block.tag
                    ));
                    continue;
                }
                _ => continue,
            }
            let mut joined: Vec<(usize, String)> = Vec::new();
            let mut continued = false;
            for (number, line) in block.lines {
                let line = strip_comment(&line).trim_end().to_owned();
                let (line, continues) = match line.strip_suffix('\\') {
                    Some(head) => (head.to_owned(), true),
                    None => (line, false),
                };
                match joined.last_mut() {
                    Some((_, previous)) if continued => {
                        previous.push(' ');
                        previous.push_str(&line);
                    }
                    _ => joined.push((number, line)),
                }
                continued = continues;
            }
            for (number, line) in joined {
                let line = line.replace("${i}", "0").replace("$i", "0");
                for words in simple_commands(&line) {
                    let Some(args) = syncopate_args(&words) else { continue };
                    checked += 1;
                    let argv = core::iter::once("syncopate".to_owned()).chain(args);
                    if let Err(e) = check_command_line(argv) {
                        failures.push(format!("{name}:{number}: `{}`: {e}", words.join(" ")));
                    }
                }
            }
        }
    }
    assert!(failures.is_empty(), "commands in the docs that do not work:\n{}", failures.join("\n"));
    println!("{checked} syncopate commands checked");
    // The docs hold dozens of commands: a walk that finds few is broken.
    assert!(checked >= 30, "only {checked} syncopate commands found in the docs");
}

/// GitHub's anchor of a heading: lower case, punctuation dropped, spaces as hyphens.
fn anchor(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

fn anchors(text: &str) -> BTreeSet<String> {
    let mut in_code = false;
    let mut out = BTreeSet::new();
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            in_code = !in_code;
        } else if !in_code && line.starts_with('#') {
            out.insert(anchor(line.trim_start_matches('#')));
        }
    }
    out
}

/// Relative link targets of a page, outside code blocks and inline code.
fn links(text: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    let mut in_code = false;
    for (i, line) in text.lines().enumerate() {
        if line.trim_start().starts_with("```") {
            in_code = !in_code;
            continue;
        }
        if in_code {
            continue;
        }
        let outside_code: String = line.split('`').step_by(2).collect::<Vec<_>>().join(" ");
        let mut rest = outside_code.as_str();
        while let Some(start) = rest.find("](") {
            let after = &rest[start + 2..];
            let Some(end) = after.find(')') else { break };
            let target = &after[..end];
            if !target.contains("://") && !target.starts_with("mailto:") && !target.is_empty() {
                out.push((i + 1, target.to_owned()));
            }
            rest = &after[end..];
        }
    }
    out
}

#[test]
fn every_relative_link_in_the_docs_resolves() {
    let mut pages: Vec<PathBuf> = [
        "README.md",
        "BENCHMARKS.md",
        "TESTING.md",
        "REPRODUCTION.md",
        "CHANGELOG.md",
        "core/WIRE.md",
        "adapters/transport/TCP.md",
    ]
    .iter()
    .map(|p| root().join(p))
    .collect();
    markdown_files(&root().join("docs"), &mut pages);
    let mut failures = Vec::new();
    let mut checked = 0;
    for page in &pages {
        let name = page.strip_prefix(root()).unwrap_or(page).display().to_string();
        let Ok(text) = std::fs::read_to_string(page) else { continue };
        for (number, target) in links(&text) {
            checked += 1;
            let (path, fragment) = match target.split_once('#') {
                Some((path, fragment)) => (path, Some(fragment)),
                None => (target.as_str(), None),
            };
            let file = if path.is_empty() { page.clone() } else { page.parent().unwrap_or(&root()).join(path) };
            if !file.exists() {
                failures.push(format!("{name}:{number}: {target}: no such file"));
                continue;
            }
            if let Some(fragment) = fragment {
                if file.extension().is_some_and(|e| e == "md") {
                    let headings = anchors(&std::fs::read_to_string(&file).unwrap_or_default());
                    if !headings.contains(fragment) {
                        failures.push(format!("{name}:{number}: {target}: no heading with that anchor"));
                    }
                }
            }
        }
    }
    assert!(failures.is_empty(), "links in the docs that lead nowhere:\n{}", failures.join("\n"));
    assert!(checked >= 20, "only {checked} relative links found in the docs");
}

/// The README shows what `cargo run --release -p syncopate-adapters -- compare` prints; the
/// simulator is deterministic, so it must be that output exactly.
#[test]
fn the_readmes_compare_output_is_what_compare_prints() {
    use syncopate_adapters::{compare, scenario::Scenario};
    let scenario = Scenario::default_scenario();
    let comparison = compare::run(&scenario, None, 2, &|_| {}).expect("the default comparison runs");
    let printed = format!("{}\n{}", comparison.scenario, comparison.table().trim_end());
    let readme = std::fs::read_to_string(root().join("README.md")).expect("README.md");
    let shown = fenced_blocks(&readme)
        .into_iter()
        .find(|b| b.tag == "text" && b.lines.first().is_some_and(|(_, l)| *l == comparison.scenario))
        .map(|b| b.lines.into_iter().map(|(_, l)| l).collect::<Vec<_>>().join("\n"))
        .expect("a text block in README.md starting with the default scenario's name");
    assert_eq!(shown, printed, "README.md's compare output differs from what compare prints now");
}
