//! [`Capped`]: one output stream of a remote command, bounded in memory.

/// Collects one stream up to a cap, keeping its **tail**: a failing script says why at its
/// end, and a secret cut by the cap can only lose its beginning, which
/// [`crate::profile::redact::Redactor::redact_window`] then redacts (a kept head would end in a
/// secret's prefix, and that end is what events quote).
pub struct Capped {
    buf: std::collections::VecDeque<u8>,
    cap: usize,
    dropped: u64,
}

impl Capped {
    pub fn new(cap: usize) -> Self {
        Capped {
            buf: std::collections::VecDeque::new(),
            cap,
            dropped: 0,
        }
    }

    pub fn push(&mut self, data: &[u8]) {
        // Only the last `cap` bytes of `data` can survive; then make room at the front.
        let skipped = data.len().saturating_sub(self.cap);
        let kept = &data[skipped..];
        let over = (self.buf.len() + kept.len()).saturating_sub(self.cap);
        self.buf.drain(..over);
        self.buf.extend(kept);
        self.dropped += (skipped + over) as u64;
    }

    pub fn into_parts(self) -> (Vec<u8>, u64) {
        (self.buf.into(), self.dropped)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn keeps_the_last_bytes_and_counts_the_rest() {
        let mut c = Capped::new(5);
        c.push(b"abc");
        c.push(b"defg");
        c.push(b"");
        assert_eq!(c.into_parts(), (b"cdefg".to_vec(), 2));
        let mut c = Capped::new(3);
        c.push(b"0123456789");
        assert_eq!(c.into_parts(), (b"789".to_vec(), 7));
        let mut c = Capped::new(0);
        c.push(b"xy");
        assert_eq!(c.into_parts(), (Vec::new(), 2));
    }

    proptest! {
        /// Whatever the chunking: the kept bytes are the stream's last `cap` bytes and kept +
        /// dropped is everything written.
        #[test]
        fn equals_the_tail_of_the_whole_stream(
            chunks in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..40), 0..20),
            cap in 0usize..100,
        ) {
            let mut c = Capped::new(cap);
            let mut all = Vec::new();
            for chunk in &chunks {
                c.push(chunk);
                all.extend_from_slice(chunk);
            }
            let (kept, dropped) = c.into_parts();
            let start = all.len().saturating_sub(cap);
            prop_assert_eq!(&kept[..], &all[start..]);
            prop_assert_eq!(dropped, start as u64);
        }
    }
}
