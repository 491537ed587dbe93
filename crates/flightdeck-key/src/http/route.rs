//! Route patterns: `/v1/items/{id}`, `/v1/items/:id`, `/files/{*rest}`.

/// A parsed path pattern.
#[derive(Debug, Clone)]
pub(crate) struct Pattern {
    segments: Vec<Segment>,
    tail: bool,
}

#[derive(Debug, Clone)]
enum Segment {
    Literal(Box<str>),
    Param,
}

impl Pattern {
    /// Parses a pattern: it starts with `/`; a segment `{name}` or `:name`
    /// matches any one segment; a last segment `{*name}` or `*` matches the
    /// rest of the path.
    pub(crate) fn parse(pattern: &str) -> Result<Self, &'static str> {
        let Some(rest) = pattern.strip_prefix('/') else {
            return Err("must start with '/'");
        };
        let mut segments = Vec::new();
        let mut tail = false;
        let pieces: Vec<&str> = rest.split('/').collect();
        for (i, piece) in pieces.iter().enumerate() {
            let last = i + 1 == pieces.len();
            if *piece == "*" || (piece.starts_with("{*") && piece.ends_with('}')) {
                if !last {
                    return Err("a wildcard '{*rest}' may only be the last segment");
                }
                tail = true;
            } else if (piece.starts_with('{') && piece.ends_with('}') && piece.len() > 2)
                || (piece.starts_with(':') && piece.len() > 1)
            {
                segments.push(Segment::Param);
            } else if piece.contains(['{', '}', '*']) {
                return Err("a segment is either literal, '{name}', ':name' or '{*rest}'");
            } else {
                segments.push(Segment::Literal((*piece).into()));
            }
        }
        Ok(Self { segments, tail })
    }

    /// Whether the (raw) request path matches.
    pub(crate) fn matches(&self, path: &str) -> bool {
        // Split as bytes: a one-byte search per piece, without `str`'s
        // pattern machinery.
        let Some(rest) = path.as_bytes().strip_prefix(b"/") else {
            return false;
        };
        let mut pieces = rest.split(|&b| b == b'/');
        for seg in &self.segments {
            let Some(piece) = pieces.next() else {
                return false;
            };
            match seg {
                Segment::Literal(lit) if lit.as_bytes() != piece => return false,
                _ => {}
            }
        }
        self.tail || pieces.next().is_none()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_match() {
        let p = Pattern::parse("/v1/items/{id}").unwrap();
        assert!(p.matches("/v1/items/42"));
        assert!(!p.matches("/v1/items/42/x"));
        assert!(!p.matches("/v1/items"));
        assert!(!p.matches("v1/items/42"));
        let p = Pattern::parse("/v1/:x/done").unwrap();
        assert!(p.matches("/v1/a/done"));
        assert!(!p.matches("/v1/a/other"));
        let p = Pattern::parse("/files/{*rest}").unwrap();
        assert!(p.matches("/files/a/b/c"));
        assert!(p.matches("/files"));
        assert!(Pattern::parse("/").unwrap().matches("/"));
        assert!(!Pattern::parse("/").unwrap().matches("/a"));
        assert!(!Pattern::parse("/").unwrap().matches(""));
        let p = Pattern::parse("/v1/items/{id}").unwrap();
        assert!(!p.matches("/v1/items/42/"));
        assert!(p.matches("/v1/items/"), "an empty segment is a segment");
        assert!(!p.matches("//items/42"));
        assert!(!p.matches("/v1/items"));
        let p = Pattern::parse("/v1/{*rest}").unwrap();
        assert!(p.matches("/v1/"));
        assert!(p.matches("/v1"));
        assert!(!p.matches("/v2/a"));
    }

    /// The matcher (bytes) agrees with a split of the `str` on '/' for every
    /// path over a small alphabet.
    #[test]
    fn matching_agrees_with_splitting() {
        fn by_split(p: &Pattern, path: &str) -> bool {
            let Some(rest) = path.strip_prefix('/') else {
                return false;
            };
            let mut pieces = rest.split('/');
            for seg in &p.segments {
                let Some(piece) = pieces.next() else {
                    return false;
                };
                if let Segment::Literal(lit) = seg {
                    if **lit != *piece {
                        return false;
                    }
                }
            }
            p.tail || pieces.next().is_none()
        }
        let patterns = ["/", "/a", "/a/{x}", "/{x}/a", "/a/{*r}", "/{x}/{x}", "/a/b"];
        let mut paths = vec![String::new()];
        for _ in 0..5 {
            let longer: Vec<String> = paths
                .iter()
                .flat_map(|p| ["a", "b", "/"].map(|c| format!("{p}{c}")))
                .collect();
            paths.extend(longer);
        }
        for pattern in patterns {
            let p = Pattern::parse(pattern).unwrap();
            for path in &paths {
                assert_eq!(p.matches(path), by_split(&p, path), "{pattern} {path:?}");
            }
        }
    }

    #[test]
    fn bad_patterns_are_rejected() {
        assert!(Pattern::parse("v1").is_err());
        assert!(Pattern::parse("/{*a}/b").is_err());
        assert!(Pattern::parse("/a{b").is_err());
    }
}
