//! [`ProgramBinary`]: a validated program, and its bytes as a `DISPATCH` reads them.
//!
//! A value of the type always holds between 1 and [`isa::MAX_INSTRUCTIONS`] words that pass
//! [`isa::validate`]: every constructor checks, so a binary built, assembled or parsed here
//! is one the device accepts.

use abi::isa::{self, Inst, ProgramError, ProgramErrorKind, ProgramHeader};

/// A validated program binary: between 1 and [`isa::MAX_INSTRUCTIONS`] instruction words that
/// pass [`isa::validate`].
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ProgramBinary {
    words: Vec<u64>,
}

impl ProgramBinary {
    /// Validates instruction words (no header).
    pub fn from_words(words: Vec<u64>) -> Result<ProgramBinary, ProgramError> {
        isa::validate(&words)?;
        Ok(ProgramBinary { words })
    }

    /// Parses and validates a binary as [`ProgramBinary::to_bytes`] writes it: the header, then
    /// exactly `header.instructions` little-endian words. A buffer too short for its header or
    /// for the count it declares, or with bytes after the last instruction, is refused with
    /// [`ProgramErrorKind::BadLength`] (a header cut short reads as zeros, so it usually fails its
    /// magic first).
    pub fn from_bytes(bytes: &[u8]) -> Result<ProgramBinary, ProgramError> {
        let mut header = [0u8; isa::PROGRAM_HEADER_BYTES as usize];
        let n = bytes.len().min(header.len());
        header[..n].copy_from_slice(&bytes[..n]);
        let mut hw = [0u32; 8];
        for (w, c) in hw.iter_mut().zip(header.chunks_exact(4)) {
            *w = u32::from_le_bytes([c[0], c[1], c[2], c[3]]);
        }
        let h = ProgramHeader::from_words(&hw)?;
        let body = &bytes[n..];
        if bytes.len() < header.len() || body.len() as u64 != h.instructions as u64 * 8 {
            return Err(ProgramError::at(0, ProgramErrorKind::BadLength(h.instructions)));
        }
        let words = body
            .chunks_exact(8)
            .map(|c| u64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]))
            .collect();
        ProgramBinary::from_words(words)
    }

    /// The header and the instruction words, little-endian: what a `DISPATCH` loads.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.byte_len() as usize);
        for w in self.header().to_words() {
            out.extend_from_slice(&w.to_le_bytes());
        }
        for w in &self.words {
            out.extend_from_slice(&w.to_le_bytes());
        }
        out
    }

    /// Its header.
    pub fn header(&self) -> ProgramHeader {
        ProgramHeader::new(self.words.len() as u32)
    }

    /// The instruction words.
    pub fn instructions(&self) -> &[u64] {
        &self.words
    }

    /// The decoded instructions.
    pub fn decode(&self) -> Vec<Inst> {
        // Validated on construction; decoding cannot fail.
        isa::validate(&self.words).unwrap_or_default()
    }

    /// Number of instructions.
    pub fn len(&self) -> usize {
        self.words.len()
    }

    /// Always false: a valid program has at least one instruction.
    pub fn is_empty(&self) -> bool {
        self.words.is_empty()
    }

    /// Size of [`ProgramBinary::to_bytes`].
    pub fn byte_len(&self) -> u64 {
        isa::PROGRAM_HEADER_BYTES + self.words.len() as u64 * 8
    }
}
