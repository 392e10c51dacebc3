//! Copying the pieces a read hands out (the receive ring's, a datagram's) into a caller's
//! slice. A leaf module: TCP's and UDP's reads both use it, and it imports neither.

/// A `put` for the `read_with`/`peek_with` reads that fills `buf` from its start, piece after
/// piece. The reads hand out at most `buf.len()` bytes in all.
pub(crate) fn slice_put(buf: &mut [u8]) -> impl FnMut(&[u8]) + '_ {
    let mut at = 0;
    move |piece: &[u8]| {
        buf[at..at + piece.len()].copy_from_slice(piece);
        at += piece.len();
    }
}

#[cfg(test)]
mod tests {
    use super::slice_put;

    #[test]
    fn pieces_land_one_after_another_from_the_start() {
        let mut buf = [0u8; 8];
        let mut put = slice_put(&mut buf);
        put(b"abc");
        put(b"");
        put(b"defg");
        drop(put);
        assert_eq!(&buf, b"abcdefg\0");
    }
}
