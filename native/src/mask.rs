//! Column mask rules (`cdcd.columns.Mask`), applied to a value's text form as the row writer writes it; the
//! masked text is written as an Avro string. SHA-256 is written here (FIPS 180-4) rather than taken from a
//! crate: the build needs nothing beyond pyo3, and tests/unit/test_native.py compares it with hashlib.

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

const K: [u32; 64] = [
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5, 0xd807aa98,
    0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174, 0xe49b69c1, 0xefbe4786,
    0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da, 0x983e5152, 0xa831c66d, 0xb00327c8,
    0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967, 0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13,
    0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85, 0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819,
    0xd6990624, 0xf40e3585, 0x106aa070, 0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a,
    0x5b9cca4f, 0x682e6ff3, 0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7,
    0xc67178f2,
];

/// SHA-256 of the concatenated `parts`.
pub fn sha256(parts: &[&[u8]]) -> [u8; 32] {
    let mut state: [u32; 8] = [
        0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19,
    ];
    let total: usize = parts.iter().map(|p| p.len()).sum();
    let mut block = [0u8; 64];
    let mut filled = 0;
    for byte in parts.iter().flat_map(|p| p.iter()) {
        block[filled] = *byte;
        filled += 1;
        if filled == 64 {
            compress(&mut state, &block);
            filled = 0;
        }
    }
    block[filled] = 0x80;
    block[filled + 1..].fill(0);
    if filled >= 56 {
        compress(&mut state, &block);
        block.fill(0);
    }
    block[56..].copy_from_slice(&((total as u64) * 8).to_be_bytes());
    compress(&mut state, &block);
    let mut digest = [0u8; 32];
    for (chunk, word) in digest.chunks_exact_mut(4).zip(state) {
        chunk.copy_from_slice(&word.to_be_bytes());
    }
    digest
}

fn compress(state: &mut [u32; 8], block: &[u8; 64]) {
    let mut w = [0u32; 64];
    for (i, chunk) in block.chunks_exact(4).enumerate() {
        w[i] = u32::from_be_bytes([chunk[0], chunk[1], chunk[2], chunk[3]]);
    }
    for i in 16..64 {
        let s0 = w[i - 15].rotate_right(7) ^ w[i - 15].rotate_right(18) ^ (w[i - 15] >> 3);
        let s1 = w[i - 2].rotate_right(17) ^ w[i - 2].rotate_right(19) ^ (w[i - 2] >> 10);
        w[i] = w[i - 16].wrapping_add(s0).wrapping_add(w[i - 7]).wrapping_add(s1);
    }
    let [mut a, mut b, mut c, mut d, mut e, mut f, mut g, mut h] = *state;
    for (k, wi) in K.iter().zip(w) {
        let s1 = e.rotate_right(6) ^ e.rotate_right(11) ^ e.rotate_right(25);
        let ch = (e & f) ^ (!e & g);
        let t1 = h.wrapping_add(s1).wrapping_add(ch).wrapping_add(*k).wrapping_add(wi);
        let s0 = a.rotate_right(2) ^ a.rotate_right(13) ^ a.rotate_right(22);
        let maj = (a & b) ^ (a & c) ^ (b & c);
        let t2 = s0.wrapping_add(maj);
        h = g;
        g = f;
        f = e;
        e = d.wrapping_add(t1);
        d = c;
        c = b;
        b = a;
        a = t1.wrapping_add(t2);
    }
    for (s, x) in state.iter_mut().zip([a, b, c, d, e, f, g, h]) {
        *s = s.wrapping_add(x);
    }
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
