//! ClickHouse's XML configuration files read with `roxmltree`, and the few path lookups the
//! checks make (`a/b/c`, `*` for any element), like ElementTree's `find`.

use std::path::Path;

use roxmltree::{Document, Node};

/// The text of the file at `path`; panics naming the file when it cannot be read.
pub fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The parsed document; panics naming the file and the parser's error when it is not
/// well-formed.
pub fn parse<'a>(path: &Path, text: &'a str) -> Document<'a> {
    Document::parse(text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The elements reached by `path` from the candidates `from` (the first step chooses among
/// them): steps are tag names, `*` any element.
pub fn find_all_in<'a, 'i: 'a>(
    from: impl IntoIterator<Item = Node<'a, 'i>>,
    path: &str,
) -> Vec<Node<'a, 'i>> {
    let mut cur: Vec<Node> = from.into_iter().filter(Node::is_element).collect();
    for (i, step) in path.split('/').enumerate() {
        if i > 0 {
            cur = cur
                .iter()
                .flat_map(|n| n.children().filter(Node::is_element))
                .collect();
        }
        cur.retain(|n| step == "*" || n.tag_name().name() == step);
    }
    cur
}

/// The elements reached by `path` below `node` (its children first).
pub fn find_all<'a, 'i: 'a>(node: Node<'a, 'i>, path: &str) -> Vec<Node<'a, 'i>> {
    find_all_in(node.children(), path)
}

/// The first element reached by `path` below `node`.
pub fn find<'a, 'i: 'a>(node: Node<'a, 'i>, path: &str) -> Option<Node<'a, 'i>> {
    find_all(node, path).into_iter().next()
}

/// The trimmed text of the first element reached by `path` below `node`.
pub fn text(node: Node, path: &str) -> Option<String> {
    find(node, path)
        .and_then(|n| n.text())
        .map(|t| t.trim().to_owned())
}

/// The trimmed text of an element ("" when it has none).
pub fn own_text(node: Node) -> String {
    node.text().unwrap_or("").trim().to_owned()
}

/// The tag name of an element.
pub fn tag(node: Node) -> String {
    node.tag_name().name().to_owned()
}
