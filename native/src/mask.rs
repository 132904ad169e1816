//! Column mask rules (`cdcd.columns.Mask`), applied to a value's text form as the row writer writes it; the
//! masked text is written as an Avro string. SHA-256 is RustCrypto's `sha2` (a hash is no place for code of one's
//! own); tests/unit/test_native.py compares the hashes with hashlib's.

use sha2::{Digest, Sha256};

use crate::avro;

pub enum Mask {
    /// Lower-case hex SHA-256 of the salt, then the text.
    Hash(Vec<u8>),
    KeepFirst(usize),
    KeepLast(usize),
    /// UTF-8 text written whatever the value (also Debezium's n stars).
    Constant(Vec<u8>),
    /// No value: the field's null branch.
    Null,
    Truncate(usize),
}

impl Mask {
    /// The rule of `cdcd.columns.Mask.native`'s (code, n, bytes); None: an unknown code.
    pub fn from_spec(code: u32, n: usize, data: Vec<u8>) -> Option<Mask> {
        Some(match code {
            1 => Mask::Hash(data),
            2 => Mask::KeepFirst(n),
            3 => Mask::KeepLast(n),
            4 => Mask::Constant(data),
            5 => Mask::Null,
            6 => Mask::Truncate(n),
            _ => return None,
        })
    }

    /// Append the Avro string of the masked `text` (`Null`: the null branch).
    pub fn write(&self, text: &str, out: &mut Vec<u8>) {
        match self {
            Mask::Hash(salt) => avro::bytes(out, &hex(&sha256(&[salt.as_slice(), text.as_bytes()]))),
            Mask::KeepFirst(n) => {
                let kept: String = text
                    .chars()
                    .enumerate()
                    .map(|(i, c)| if i < *n { c } else { '*' })
                    .collect();
                avro::bytes(out, kept.as_bytes());
            }
            Mask::KeepLast(n) => {
                let hidden = text.chars().count().saturating_sub(*n);
                let kept: String = text
                    .chars()
                    .enumerate()
                    .map(|(i, c)| if i >= hidden { c } else { '*' })
                    .collect();
                avro::bytes(out, kept.as_bytes());
            }
            Mask::Constant(constant) => avro::bytes(out, constant),
            Mask::Truncate(n) => {
                let end = text.char_indices().nth(*n).map_or(text.len(), |(i, _)| i);
                avro::bytes(out, &text.as_bytes()[..end]);
            }
            Mask::Null => out.push(0),
        }
    }
}

fn hex(digest: &[u8; 32]) -> [u8; 64] {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = [0u8; 64];
    for (i, b) in digest.iter().enumerate() {
        out[2 * i] = DIGITS[(b >> 4) as usize];
        out[2 * i + 1] = DIGITS[(b & 15) as usize];
    }
    out
}

/// SHA-256 of the concatenated `parts` (RustCrypto's `sha2`, with the CPU's SHA extensions where it has them).
pub fn sha256(parts: &[&[u8]]) -> [u8; 32] {
    let mut hasher = Sha256::new();
    for part in parts {
        hasher.update(part);
    }
    hasher.finalize().into()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hashed(parts: &[&[u8]]) -> String {
        String::from_utf8(hex(&sha256(parts)).to_vec()).unwrap()
    }

    #[test]
    fn sha256_of_the_standard_vectors() {
        assert_eq!(
            hashed(&[b""]),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
        assert_eq!(
            hashed(&[b"ab", b"c"]),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        let long = b"abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
        assert_eq!(
            hashed(&[long]),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1"
        );
    }

    fn masked(mask: Mask, text: &str) -> String {
        let mut out = Vec::new();
        mask.write(text, &mut out);
        String::from_utf8(out[1..].to_vec()).unwrap() // short strings: a one-byte length
    }

    #[test]
    fn counted_rules_count_characters() {
        assert_eq!(masked(Mask::KeepFirst(2), "héllo"), "hé***");
        assert_eq!(masked(Mask::KeepLast(2), "héllo"), "***lo");
        assert_eq!(masked(Mask::KeepLast(9), "ab"), "ab");
        assert_eq!(masked(Mask::Truncate(2), "éèà"), "éè");
        assert_eq!(masked(Mask::Truncate(5), "ab"), "ab");
    }
}
