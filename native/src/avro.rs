//! Avro binary primitives, as `cdcd.avro.encoder` writes them.

/// Avro varint of an already zigzag-encoded value.
#[inline]
pub fn varint(out: &mut Vec<u8>, mut z: u64) {
    while z >= 0x80 {
        out.push((z as u8) | 0x80);
        z >>= 7;
    }
    out.push(z as u8);
}

/// Avro int/long: zigzag varint.
#[inline]
pub fn long(out: &mut Vec<u8>, n: i64) {
    varint(out, ((n << 1) ^ (n >> 63)) as u64);
}

/// Avro bytes/string: length, then the bytes.
#[inline]
pub fn bytes(out: &mut Vec<u8>, b: &[u8]) {
    long(out, b.len() as i64);
    out.extend_from_slice(b);
}

/// Avro decimal bytes of an unscaled value, sized as fastavro sizes them: (bit_length(|n|) + 8) / 8 bytes of
/// big-endian two's complement.
pub fn decimal(out: &mut Vec<u8>, n: i128) {
    let bits = 128 - n.unsigned_abs().leading_zeros() as usize;
    let len = (bits + 8) / 8;
    let all = n.to_be_bytes();
    bytes(out, &all[16 - len..]);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn enc(n: i64) -> Vec<u8> {
        let mut v = Vec::new();
        long(&mut v, n);
        v
    }

    #[test]
    fn zigzag() {
        assert_eq!(enc(0), [0]);
        assert_eq!(enc(-1), [1]);
        assert_eq!(enc(1), [2]);
        assert_eq!(enc(64), [0x80, 1]);
        assert_eq!(enc(i64::MIN), [0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 1]);
    }

    #[test]
    fn decimals() {
        let mut v = Vec::new();
        decimal(&mut v, -128);
        assert_eq!(v, [4, 0xff, 0x80]);
        v.clear();
        decimal(&mut v, 0);
        assert_eq!(v, [2, 0]);
    }
}
