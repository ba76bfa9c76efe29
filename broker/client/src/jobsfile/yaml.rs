//! The YAML of a jobs file as a small tree whose every node knows its line,
//! so each validation error can name where it is. Built from the events of
//! `saphyr-parser` (a maintained pure-Rust YAML 1.2 parser). Anchors and
//! aliases are refused (a jobs file has no use for them, and they are how a
//! small file expands into a huge one), and so are tags and multiple
//! documents; depth and size are bounded.

use std::borrow::Cow;

use saphyr_parser::{Event, Parser, ScalarStyle, Span};

/// The deepest nesting accepted (a jobs file needs about five levels).
pub const MAX_DEPTH: usize = 32;
/// The most nodes accepted in one file.
pub const MAX_NODES: usize = 200_000;

/// A scalar's text and whether it was written plain (unquoted), which
/// decides whether `3` is a number or the string "3".
#[derive(Clone, Debug, PartialEq)]
pub struct Scalar {
    pub text: String,
    pub plain: bool,
}

#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    Scalar(Scalar),
    Seq(Vec<Node>),
    /// Keys in file order; keys are scalars (a complex key is refused).
    Map(Vec<(Node, Node)>),
}

/// A node and the line (1-based) where it starts.
#[derive(Clone, Debug, PartialEq)]
pub struct Node {
    pub line: usize,
    pub value: Value,
}

/// A syntax error and its line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SyntaxError {
    pub line: usize,
    pub message: String,
}

impl Node {
    /// What the node is, for messages: "a list", "a mapping", "a scalar".
    pub fn kind(&self) -> &'static str {
        match self.value {
            Value::Scalar(_) => "a single value",
            Value::Seq(_) => "a list",
            Value::Map(_) => "a mapping",
        }
    }

    /// The scalar's text when the node is one.
    pub fn scalar(&self) -> Option<&Scalar> {
        match &self.value {
            Value::Scalar(s) => Some(s),
            _ => None,
        }
    }

    /// A plain `null`/`~` or an empty plain scalar.
    pub fn is_null(&self) -> bool {
        matches!(&self.value, Value::Scalar(s) if s.plain && matches!(s.text.as_str(), "" | "~" | "null" | "Null" | "NULL"))
    }
}

/// Parses one YAML document (an empty file is `None`).
pub fn parse(text: &str) -> Result<Option<Node>, SyntaxError> {
    let mut builder = Builder::default();
    let mut parser = Parser::new_from_str(text);
    let mut documents = 0;
    while let Some(item) = parser.next_event() {
        let (event, span) = item.map_err(|e| SyntaxError {
            line: e.marker().line(),
            message: e.info().to_owned(),
        })?;
        if let Event::DocumentStart(_) = event {
            documents += 1;
            if documents > 1 {
                return Err(err(&span, "more than one YAML document (---): a jobs file is one document"));
            }
        }
        builder.event(event, &span)?;
    }
    Ok(builder.root)
}

fn err(span: &Span, message: &str) -> SyntaxError {
    SyntaxError {
        line: span.start.line(),
        message: message.to_owned(),
    }
}

enum Open {
    Seq(usize, Vec<Node>),
    /// The entries so far and a key waiting for its value.
    Map(usize, Vec<(Node, Node)>, Option<Node>),
}

#[derive(Default)]
struct Builder {
    stack: Vec<Open>,
    root: Option<Node>,
    nodes: usize,
}

impl Builder {
    fn event(&mut self, event: Event<'_>, span: &Span) -> Result<(), SyntaxError> {
        let line = span.start.line();
        match event {
            Event::Alias(_) => Err(err(span, "aliases (*name) are not supported in a jobs file")),
            Event::Scalar(_, _, anchor, _) | Event::SequenceStart(anchor, _) | Event::MappingStart(anchor, _)
                if anchor != 0 =>
            {
                Err(err(span, "anchors (&name) are not supported in a jobs file"))
            }
            Event::Scalar(_, _, _, Some(_)) | Event::SequenceStart(_, Some(_)) | Event::MappingStart(_, Some(_)) => {
                Err(err(span, "tags (!name) are not supported in a jobs file"))
            }
            Event::Scalar(text, style, _, None) => {
                let plain = style == ScalarStyle::Plain;
                self.push(
                    Node {
                        line,
                        value: Value::Scalar(Scalar { text: Cow::into_owned(text), plain }),
                    },
                    span,
                )
            }
            Event::SequenceStart(_, None) => self.open(Open::Seq(line, Vec::new()), span),
            Event::MappingStart(_, None) => self.open(Open::Map(line, Vec::new(), None), span),
            Event::SequenceEnd | Event::MappingEnd => {
                let node = match self.stack.pop() {
                    Some(Open::Seq(line, items)) => Node { line, value: Value::Seq(items) },
                    Some(Open::Map(line, entries, _)) => Node { line, value: Value::Map(entries) },
                    None => return Err(err(span, "unbalanced end of a list or mapping")),
                };
                self.attach(node, span)
            }
            _ => Ok(()),
        }
    }

    fn open(&mut self, open: Open, span: &Span) -> Result<(), SyntaxError> {
        if self.stack.len() >= MAX_DEPTH {
            return Err(err(span, &format!("nested more than {MAX_DEPTH} levels deep")));
        }
        self.count(span)?;
        self.stack.push(open);
        Ok(())
    }

    fn push(&mut self, node: Node, span: &Span) -> Result<(), SyntaxError> {
        self.count(span)?;
        self.attach(node, span)
    }

    fn count(&mut self, span: &Span) -> Result<(), SyntaxError> {
        self.nodes += 1;
        if self.nodes > MAX_NODES {
            return Err(err(span, &format!("more than {MAX_NODES} values in one file")));
        }
        Ok(())
    }

    fn attach(&mut self, node: Node, span: &Span) -> Result<(), SyntaxError> {
        match self.stack.last_mut() {
            None => {
                self.root = Some(node);
                Ok(())
            }
            Some(Open::Seq(_, items)) => {
                items.push(node);
                Ok(())
            }
            Some(Open::Map(_, entries, key)) => match key.take() {
                None => {
                    if node.scalar().is_none() {
                        return Err(err(span, "a key must be a single value, not a list or mapping"));
                    }
                    *key = Some(node);
                    Ok(())
                }
                Some(k) => {
                    entries.push((k, node));
                    Ok(())
                }
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map_keys(n: &Node) -> Vec<(String, usize)> {
        match &n.value {
            Value::Map(e) => e.iter().map(|(k, v)| (k.scalar().unwrap().text.clone(), v.line)).collect(),
            _ => panic!("not a map"),
        }
    }

    #[test]
    fn lines_and_plain_scalars() {
        let doc = "jobs:\n  - name: a\n    cpus: 2\n  - name: \"3\"\n";
        let root = parse(doc).unwrap().unwrap();
        assert_eq!(map_keys(&root), vec![("jobs".into(), 2)]);
        let Value::Map(e) = &root.value else { panic!() };
        let Value::Seq(items) = &e[0].1.value else { panic!() };
        assert_eq!(items.iter().map(|n| n.line).collect::<Vec<_>>(), vec![2, 4]);
        assert_eq!(map_keys(&items[0]), vec![("name".into(), 2), ("cpus".into(), 3)]);
        let Value::Map(second) = &items[1].value else { panic!() };
        assert_eq!(second[0].1.scalar(), Some(&Scalar { text: "3".into(), plain: false }));
    }

    #[test]
    fn empty_file_is_none() {
        assert_eq!(parse("").unwrap(), None);
        assert_eq!(parse("# only a comment\n").unwrap(), None);
    }

    #[test]
    fn refuses_aliases_tags_and_documents() {
        let e = parse("a: &x [1, 2]\nb: *x\n").unwrap_err();
        assert!(e.message.contains("anchors"), "{e:?}");
        assert_eq!(e.line, 1);
        assert!(parse("a: !!str 3\n").unwrap_err().message.contains("tags"));
        let e = parse("a: 1\n---\nb: 2\n").unwrap_err();
        assert!(e.message.contains("more than one"), "{e:?}");
        assert_eq!(e.line, 2);
    }

    #[test]
    fn syntax_errors_have_lines() {
        let e = parse("jobs:\n  - name: a\n   bad: [\n").unwrap_err();
        assert!(e.line >= 3, "{e:?}");
    }

    #[test]
    fn depth_is_bounded() {
        let deep = "[".repeat(MAX_DEPTH + 1) + &"]".repeat(MAX_DEPTH + 1);
        assert!(parse(&deep).unwrap_err().message.contains("nested"));
    }
}
