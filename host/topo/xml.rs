//! A small XML reader and writer for NCCL's topology files (`NCCL_TOPO_FILE`,
//! `NCCL_TOPO_DUMP_FILE`): elements, attributes, comments and the `<?xml ?>` prolog. Text content is
//! ignored (NCCL's topology format has none). Attribute order is kept, so a dump of a loaded file
//! reproduces it.

use crate::error::{Error, Result};

/// One element: its name, its attributes in file order and its child elements.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct XmlNode {
    pub name: String,
    pub attrs: Vec<(String, String)>,
    pub children: Vec<XmlNode>,
}

impl XmlNode {
    pub fn new(name: &str) -> XmlNode {
        XmlNode {
            name: name.to_string(),
            ..Default::default()
        }
    }

    /// Builder form of [`XmlNode::set`].
    pub fn with(mut self, key: &str, value: impl ToString) -> XmlNode {
        self.set(key, value);
        self
    }

    /// Builder form of pushing a child.
    pub fn child(mut self, c: XmlNode) -> XmlNode {
        self.children.push(c);
        self
    }

    pub fn attr(&self, key: &str) -> Option<&str> {
        self.attrs
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    /// An attribute as an integer (decimal or 0x-hexadecimal), if present and well formed.
    pub fn attr_int(&self, key: &str) -> Option<i64> {
        self.attr(key).and_then(crate::env::parse_int)
    }

    pub fn set(&mut self, key: &str, value: impl ToString) {
        let value = value.to_string();
        match self.attrs.iter_mut().find(|(k, _)| k == key) {
            Some(kv) => kv.1 = value,
            None => self.attrs.push((key.to_string(), value)),
        }
    }

    /// Every descendant (self included) named `name`, depth first.
    pub fn find_all<'a>(&'a self, name: &str, out: &mut Vec<&'a XmlNode>) {
        if self.name == name {
            out.push(self);
        }
        for c in &self.children {
            c.find_all(name, out);
        }
    }

    /// Parses a document and returns its root element.
    pub fn parse(text: &str) -> Result<XmlNode> {
        let mut p = Parser {
            s: text.as_bytes(),
            i: 0,
        };
        p.skip_misc()?;
        let root = p.element()?;
        p.skip_misc()?;
        if p.i < p.s.len() {
            return Err(p.err("content after the root element"));
        }
        Ok(root)
    }

    /// The document as text, two spaces of indent per level, as NCCL writes it.
    pub fn to_text(&self) -> String {
        let mut out = String::new();
        self.write(&mut out, 0);
        out
    }

    fn write(&self, out: &mut String, depth: usize) {
        for _ in 0..depth {
            out.push_str("  ");
        }
        out.push('<');
        out.push_str(&self.name);
        for (k, v) in &self.attrs {
            out.push(' ');
            out.push_str(k);
            out.push_str("=\"");
            escape(v, out);
            out.push('"');
        }
        if self.children.is_empty() {
            out.push_str("/>\n");
            return;
        }
        out.push_str(">\n");
        for c in &self.children {
            c.write(out, depth + 1);
        }
        for _ in 0..depth {
            out.push_str("  ");
        }
        out.push_str("</");
        out.push_str(&self.name);
        out.push_str(">\n");
    }
}

fn escape(v: &str, out: &mut String) {
    for ch in v.chars() {
        match ch {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            c => out.push(c),
        }
    }
}

fn unescape(v: &str) -> String {
    if !v.contains('&') {
        return v.to_string();
    }
    v.replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&quot;", "\"")
        .replace("&apos;", "'")
        .replace("&amp;", "&")
}

struct Parser<'a> {
    s: &'a [u8],
    i: usize,
}

impl Parser<'_> {
    fn err(&self, what: &str) -> Error {
        let line = 1 + self.s[..self.i.min(self.s.len())]
            .iter()
            .filter(|&&b| b == b'\n')
            .count();
        Error::invalid_argument(format!("topology XML, line {line}: {what}"))
    }

    fn peek(&self) -> Option<u8> {
        self.s.get(self.i).copied()
    }

    fn starts(&self, pat: &str) -> bool {
        self.s[self.i..].starts_with(pat.as_bytes())
    }

    fn skip_ws(&mut self) {
        while matches!(self.peek(), Some(b) if b.is_ascii_whitespace()) {
            self.i += 1;
        }
    }

    fn skip_until(&mut self, end: &str) -> Result<()> {
        while self.i < self.s.len() {
            if self.starts(end) {
                self.i += end.len();
                return Ok(());
            }
            self.i += 1;
        }
        Err(self.err(&format!("missing '{end}'")))
    }

    /// Whitespace, comments, processing instructions and doctype.
    fn skip_misc(&mut self) -> Result<()> {
        loop {
            self.skip_ws();
            if self.starts("<!--") {
                self.skip_until("-->")?;
            } else if self.starts("<?") {
                self.skip_until("?>")?;
            } else if self.starts("<!") {
                self.skip_until(">")?;
            } else {
                return Ok(());
            }
        }
    }

    fn name(&mut self) -> Result<String> {
        let start = self.i;
        while matches!(self.peek(), Some(b) if b.is_ascii_alphanumeric() || b"_-:.".contains(&b)) {
            self.i += 1;
        }
        if start == self.i {
            return Err(self.err("expected a name"));
        }
        Ok(String::from_utf8_lossy(&self.s[start..self.i]).into_owned())
    }

    fn element(&mut self) -> Result<XmlNode> {
        if self.peek() != Some(b'<') {
            return Err(self.err("expected '<'"));
        }
        self.i += 1;
        let mut node = XmlNode::new(&self.name()?);
        loop {
            self.skip_ws();
            match self.peek() {
                Some(b'/') => {
                    self.i += 1;
                    if self.peek() != Some(b'>') {
                        return Err(self.err("expected '>' after '/'"));
                    }
                    self.i += 1;
                    return Ok(node);
                }
                Some(b'>') => {
                    self.i += 1;
                    break;
                }
                Some(_) => {
                    let key = self.name()?;
                    self.skip_ws();
                    if self.peek() != Some(b'=') {
                        return Err(self.err(&format!("attribute {key} has no value")));
                    }
                    self.i += 1;
                    self.skip_ws();
                    let q = match self.peek() {
                        Some(q @ (b'"' | b'\'')) => q,
                        _ => return Err(self.err(&format!("attribute {key}: expected a quote"))),
                    };
                    self.i += 1;
                    let start = self.i;
                    while matches!(self.peek(), Some(b) if b != q) {
                        self.i += 1;
                    }
                    if self.peek().is_none() {
                        return Err(self.err("unterminated attribute value"));
                    }
                    let raw = String::from_utf8_lossy(&self.s[start..self.i]).into_owned();
                    self.i += 1;
                    node.attrs.push((key, unescape(&raw)));
                }
                None => return Err(self.err(&format!("unterminated <{}>", node.name))),
            }
        }
        // Content: children, comments and ignored text, then the closing tag.
        loop {
            while matches!(self.peek(), Some(b) if b != b'<') {
                self.i += 1;
            }
            if self.peek().is_none() {
                return Err(self.err(&format!("<{}> is never closed", node.name)));
            }
            if self.starts("</") {
                self.i += 2;
                let end = self.name()?;
                if end != node.name {
                    return Err(self.err(&format!("</{end}> closes <{}>", node.name)));
                }
                self.skip_ws();
                if self.peek() != Some(b'>') {
                    return Err(self.err("expected '>'"));
                }
                self.i += 1;
                return Ok(node);
            }
            if self.starts("<!--") || self.starts("<?") || self.starts("<!") {
                self.skip_misc()?;
                continue;
            }
            node.children.push(self.element()?);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_writes() {
        let text = "<?xml version=\"1.0\"?>\n<!-- c -->\n<system version=\"1\">\n  <cpu numaid='0' affinity=\"ff\">\n    <pci busid=\"0000:07:00.0\" class=\"0x030200\"><gpu dev=\"0\" sm=\"90\"/></pci>\n  </cpu>\n</system>\n";
        let x = XmlNode::parse(text).unwrap();
        assert_eq!(x.name, "system");
        assert_eq!(x.children[0].attr("numaid"), Some("0"));
        assert_eq!(
            x.children[0].children[0].children[0].attr_int("sm"),
            Some(90)
        );
        let again = XmlNode::parse(&x.to_text()).unwrap();
        assert_eq!(again, x);
        let esc = XmlNode::new("a").with("v", "<&\">");
        assert_eq!(XmlNode::parse(&esc.to_text()).unwrap(), esc);
    }

    #[test]
    fn reports_errors_with_lines() {
        for bad in [
            "<system>",
            "<system></cpu>",
            "<system a=1/>",
            "<system a/>",
            "",
            "<a/><b/>",
        ] {
            let e = XmlNode::parse(bad).unwrap_err();
            assert_eq!(e.code, crate::error::NcclResult::InvalidArgument, "{bad}");
            assert!(e.message.contains("line"), "{}", e.message);
        }
    }
}
