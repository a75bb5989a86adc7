//! The assembler's lexer: one line of `.dbk` text to tokens with their columns.
//!
//! Comments (`;` or `#` to the end of the line) are dropped. Word and number tokens are
//! bounded at [`MAX_TOKEN`] characters, so every later message that quotes a token is
//! bounded too; an unexpected character is an [`AsmError`] at its column.

use crate::AsmError;

#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Tok {
    /// Mnemonic, register, builtin (`%…`), `inf`/`nan`.
    Word(String),
    /// A number, unsigned as written (`12`, `0x1f`, `1.5e-3`).
    Num(String),
    Comma,
    LBracket,
    RBracket,
    Plus,
    Minus,
}

#[derive(Clone, Debug)]
pub(crate) struct Token {
    pub(crate) tok: Tok,
    pub(crate) col: usize,
}

impl Token {
    pub(crate) fn show(&self) -> String {
        match &self.tok {
            Tok::Word(s) | Tok::Num(s) => s.clone(),
            Tok::Comma => ",".into(),
            Tok::LBracket => "[".into(),
            Tok::RBracket => "]".into(),
            Tok::Plus => "+".into(),
            Tok::Minus => "-".into(),
        }
    }
}

/// The tokens of one line, and the column just past its last non-blank character before any
/// comment (where "missing operand" errors point).
pub(crate) fn lex(text: &str, line: usize) -> Result<(Vec<Token>, usize), AsmError> {
    let chars: Vec<char> = text.chars().collect();
    let code = chars.iter().position(|&c| c == ';' || c == '#').unwrap_or(chars.len());
    let end = chars[..code].iter().rposition(|c| !c.is_whitespace()).map_or(1, |p| p + 2);
    let mut out = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        let col = i + 1;
        let punct = match c {
            ';' | '#' => break,
            ',' => Some(Tok::Comma),
            '[' => Some(Tok::LBracket),
            ']' => Some(Tok::RBracket),
            '+' => Some(Tok::Plus),
            '-' => Some(Tok::Minus),
            _ => None,
        };
        if let Some(t) = punct {
            out.push(Token { tok: t, col });
            i += 1;
        } else if c.is_whitespace() {
            i += 1;
        } else if c.is_ascii_alphabetic() || c == '_' || c == '%' {
            let start = i;
            i += 1;
            while i < chars.len() && (chars[i].is_ascii_alphanumeric() || chars[i] == '.' || chars[i] == '_') {
                i += 1;
            }
            out.push(Token { tok: Tok::Word(bounded(&chars[start..i], line, col)?), col });
        } else if c.is_ascii_digit() {
            let start = i;
            let hex = chars.get(i + 1).is_some_and(|&x| x == 'x' || x == 'X') && c == '0';
            i += 1;
            while i < chars.len() {
                let x = chars[i];
                let exp_sign = (x == '+' || x == '-') && !hex && matches!(chars[i - 1], 'e' | 'E');
                if x.is_ascii_alphanumeric() || x == '.' || x == '_' || exp_sign {
                    i += 1;
                } else {
                    break;
                }
            }
            out.push(Token { tok: Tok::Num(bounded(&chars[start..i], line, col)?), col });
        } else {
            return Err(AsmError { line, column: col, reason: format!("unexpected character `{}`", c.escape_debug()) });
        }
    }
    Ok((out, end))
}

/// Longest word or number token: far longer than any mnemonic, register, builtin or literal.
/// Bounding tokens here bounds every later message that quotes one.
const MAX_TOKEN: usize = 64;
/// Characters of an over-long token an error quotes.
const EXCERPT: usize = 32;

/// The token's text, or an error quoting its first [`EXCERPT`] characters and its length when it
/// is longer than [`MAX_TOKEN`].
fn bounded(token: &[char], line: usize, column: usize) -> Result<String, AsmError> {
    if token.len() <= MAX_TOKEN {
        return Ok(token.iter().collect());
    }
    let head: String = token[..EXCERPT].iter().collect();
    let reason = format!(
        "`{head}…` ({} characters) is too long: no mnemonic, register, builtin or number is longer than {MAX_TOKEN}",
        token.len()
    );
    Err(AsmError { line, column, reason })
}
