//! Integral JSON numbers written with a fraction or an exponent (`600.0`,
//! `1e3`), as integers.
//!
//! The OpenAPI document gives counts and amounts `type: integer`, and JSON
//! Schema counts `600.0` as an integer: a gateway whose JSON encoder writes
//! floats (Python's `json.dumps(600.0)`, for one) sends schema-valid bodies
//! that serde's `u64` refuses ("invalid type: floating point"). schemathesis
//! found it (`scripts/fuzz-openapi`, check ST202). [`integral_as_integers`]
//! rewrites such numbers in the body's bytes, and [`super::ApiJson`] tries
//! the body again with them, only after a body failed to deserialize, so a
//! body of plain integers never pays for it.
//!
//! Rewritten: a number with a fraction or an exponent whose value is a whole
//! number of magnitude at most 2^53 (every such value is exact in an `f64`).
//! Left alone: `600.5` (still refused, with serde's message), `1e300` and
//! any other whole number too large to be exact. Strings are copied as they
//! are, escapes included. The rewrite works on bytes, so it keeps what a
//! parse to a `serde_json::Value` would lose (a duplicate key is still
//! refused).

/// 2^53: every whole number up to it is exact in an `f64`.
const EXACT_MAX: f64 = 9_007_199_254_740_992.0;

/// `body` with every integral number written as an integer, or `None` when
/// there was none to rewrite.
pub fn integral_as_integers(body: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(body.len());
    let mut changed = false;
    let mut i = 0;
    while i < body.len() {
        match body[i] {
            b'"' => {
                let end = string_end(body, i);
                out.extend_from_slice(&body[i..end]);
                i = end;
            }
            b'-' | b'0'..=b'9' => {
                let end = body[i..]
                    .iter()
                    .position(|b| !matches!(b, b'-' | b'+' | b'.' | b'e' | b'E' | b'0'..=b'9'))
                    .map_or(body.len(), |n| i + n);
                let token = &body[i..end];
                match integral(token) {
                    Some(whole) => {
                        out.extend_from_slice(whole.to_string().as_bytes());
                        changed = true;
                    }
                    None => out.extend_from_slice(token),
                }
                i = end;
            }
            b => {
                out.push(b);
                i += 1;
            }
        }
    }
    changed.then_some(out)
}

/// The index just past the string that opens at `start` (or the body's end).
fn string_end(body: &[u8], start: usize) -> usize {
    let mut i = start + 1;
    while i < body.len() {
        match body[i] {
            b'\\' => i += 2,
            b'"' => return i + 1,
            _ => i += 1,
        }
    }
    body.len()
}

/// The whole number a fraction or exponent token stands for, if it is one.
fn integral(token: &[u8]) -> Option<i64> {
    if !token.iter().any(|b| matches!(b, b'.' | b'e' | b'E')) {
        return None;
    }
    let value: f64 = std::str::from_utf8(token).ok()?.parse().ok()?;
    let whole = value.is_finite() && value.fract() == 0.0 && value.abs() <= EXACT_MAX;
    // `as` is exact here: |value| ≤ 2^53 and it has no fraction.
    whole.then_some(value as i64)
}

#[cfg(test)]
mod tests {
    use super::integral_as_integers;

    fn rewrite(body: &str) -> Option<String> {
        integral_as_integers(body.as_bytes()).map(|b| String::from_utf8(b).unwrap())
    }

    #[test]
    fn integral_numbers_become_integers_and_nothing_else_changes() {
        assert_eq!(
            rewrite(r#"{"units": 600.0, "b": [1e3, -2.0E0, 0.0]}"#).as_deref(),
            Some(r#"{"units": 600, "b": [1000, -2, 0]}"#)
        );
        assert_eq!(
            rewrite(r#"{"x":9007199254740992.0}"#).as_deref(),
            Some(r#"{"x":9007199254740992}"#)
        );
    }

    #[test]
    fn fractions_huge_numbers_plain_integers_and_strings_are_left_alone() {
        assert_eq!(rewrite(r#"{"units": 600.5}"#), None);
        assert_eq!(rewrite(r#"{"units": 1e300}"#), None);
        assert_eq!(rewrite(r#"{"units": 9007199254740994.0}"#), None);
        assert_eq!(rewrite(r#"{"units": 600, "id": "a-1.0"}"#), None);
        assert_eq!(rewrite(r#"{"s": "say \"2.0\" \\", "t": true}"#), None);
        assert_eq!(
            rewrite(r#"{"s": "\"1.0", "n": 1.0}"#).as_deref(),
            Some(r#"{"s": "\"1.0", "n": 1}"#)
        );
    }
}
