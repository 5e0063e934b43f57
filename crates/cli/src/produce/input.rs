//! The documents `sluice produce` sends: a JSON-lines file, or stdin spooled to a
//! temporary file first, read twice. The first pass checks every line, so that a bad
//! line is reported (its file and line) before anything is sent; the second hands the
//! documents out in chunks. Reading twice rather than holding the documents keeps a
//! file of any size within one chunk of memory. Blank lines are skipped.

use anyhow::{Context as _, anyhow, bail};
use serde::de::IgnoredAny;
use std::fs::File;
use std::io::{BufRead, BufReader, Seek};
use std::path::Path;

pub struct Input {
    /// The file's path, or `stdin`, for messages.
    name: String,
    reader: BufReader<File>,
    /// The line read last, reused.
    line: Vec<u8>,
}

impl Input {
    /// Opens `path`; `-` copies stdin into a temporary file.
    pub fn open(path: &Path) -> anyhow::Result<Input> {
        let (name, file) = if path == Path::new("-") {
            let mut spool = tempfile::tempfile().context("creating a temporary file for stdin")?;
            std::io::copy(&mut std::io::stdin().lock(), &mut spool).context("reading stdin")?;
            ("stdin".to_string(), spool)
        } else {
            let name = path.display().to_string();
            let file = File::open(path).with_context(|| format!("cannot open {name}"))?;
            (name, file)
        };
        let mut input = Input {
            name,
            reader: BufReader::new(file),
            line: Vec::new(),
        };
        input.rewind()?;
        Ok(input)
    }

    fn rewind(&mut self) -> anyhow::Result<()> {
        (self.reader.rewind()).with_context(|| format!("cannot read {}", self.name))
    }

    /// The next non-blank line, trimmed, and its number; `None` at the end.
    fn next_line(&mut self, number: &mut u64) -> anyhow::Result<Option<&[u8]>> {
        loop {
            self.line.clear();
            let read = (self.reader.read_until(b'\n', &mut self.line))
                .with_context(|| format!("cannot read {}", self.name))?;
            if read == 0 {
                return Ok(None);
            }
            *number += 1;
            if !self.line.trim_ascii().is_empty() {
                return Ok(Some(self.line.trim_ascii()));
            }
        }
    }

    /// Checks that every non-blank line is one JSON document, and rewinds; returns how
    /// many there are. An error names the first line that is not.
    pub fn check(&mut self) -> anyhow::Result<u64> {
        let (mut number, mut documents) = (0, 0);
        while let Some(line) = self.next_line(&mut number)? {
            if let Err(why) = json_document(line) {
                bail!(
                    "{} line {number}: {why}; nothing was sent (fix the line and run again)",
                    self.name
                );
            }
            documents += 1;
        }
        self.rewind()?;
        Ok(documents)
    }

    /// The next documents, about `bytes` of them (at least one while any is left);
    /// empty at the end.
    pub fn next_chunk(&mut self, bytes: usize) -> anyhow::Result<Vec<Vec<u8>>> {
        let (mut chunk, mut size, mut number) = (Vec::new(), 0, 0);
        while size < bytes {
            let Some(line) = self.next_line(&mut number)? else {
                break;
            };
            size += line.len();
            chunk.push(line.to_vec());
        }
        Ok(chunk)
    }
}

/// Why `line` is not one JSON document, in the words of every source's bad-input error.
fn json_document(line: &[u8]) -> anyhow::Result<()> {
    let parsed = match std::str::from_utf8(line) {
        Ok(text) => serde_json::from_str::<IgnoredAny>(text).map(drop),
        // Skipping over a string does not check its bytes: parse it whole to fail.
        Err(_) => serde_json::from_slice::<serde_json::Value>(line).map(drop),
    };
    parsed.map_err(|e| anyhow!(sluice_source_sdk::bad_json(line, &e)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write as _;

    fn input(text: &[u8]) -> (tempfile::NamedTempFile, Input) {
        let mut file = tempfile::NamedTempFile::new().unwrap();
        file.write_all(text).unwrap();
        let input = Input::open(file.path()).unwrap();
        (file, input)
    }

    #[test]
    fn documents_are_counted_then_handed_out_in_chunks_blank_lines_skipped() {
        let (_file, mut input) = input(b"{\"a\":1}\r\n\n  \n[2]\n\"three\"\n{\"a\":4}");
        assert_eq!(input.check().unwrap(), 4);
        assert_eq!(
            input.next_chunk(8).unwrap(),
            [b"{\"a\":1}".to_vec(), b"[2]".to_vec()]
        );
        assert_eq!(
            input.next_chunk(1 << 20).unwrap(),
            [b"\"three\"".to_vec(), b"{\"a\":4}".to_vec()]
        );
        assert!(input.next_chunk(1 << 20).unwrap().is_empty());
    }

    #[test]
    fn a_line_that_is_not_one_document_is_named_by_its_number() {
        for (text, expected) in [
            (
                &b"{\"a\":1}\n\n{\"a\":2} x\n{\"a\":3}\n"[..],
                "line 3: invalid JSON at column 9: trailing characters",
            ),
            (
                b"{\"a\":1}\n{\"a\":\n",
                "line 2: invalid JSON at column 5: EOF while parsing",
            ),
            (
                b"{\"a\":\"\xff\"}\n",
                "line 1: invalid UTF-8 at byte 6 of the line",
            ),
        ] {
            let (_file, mut input) = input(text);
            let error = input.check().unwrap_err().to_string();
            assert!(error.contains(expected), "{error}");
            assert!(
                error.ends_with("nothing was sent (fix the line and run again)"),
                "{error}"
            );
        }
    }
}
