//! A pcap file (the classic format, nanosecond timestamps, Ethernet frames) of the
//! monitor's events, as tcpdump and tshark read it.

use std::io::{self, Write};

/// The classic pcap format's magic number for nanosecond timestamps.
const MAGIC_NANOS: u32 = 0xa1b2_3c4d;
/// `LINKTYPE_ETHERNET`.
const ETHERNET: u32 = 1;

/// Writes frames to a pcap stream.
pub struct Pcap<W: Write> {
    out: W,
}

impl<W: Write> Pcap<W> {
    /// Starts the stream: the file header, snapshot length `snaplen`.
    pub fn new(mut out: W, snaplen: u32) -> io::Result<Self> {
        let mut header = Vec::with_capacity(24);
        header.extend_from_slice(&MAGIC_NANOS.to_le_bytes());
        header.extend_from_slice(&2u16.to_le_bytes());
        header.extend_from_slice(&4u16.to_le_bytes());
        header.extend_from_slice(&0i32.to_le_bytes());
        header.extend_from_slice(&0u32.to_le_bytes());
        header.extend_from_slice(&snaplen.to_le_bytes());
        header.extend_from_slice(&ETHERNET.to_le_bytes());
        out.write_all(&header)?;
        Ok(Pcap { out })
    }

    /// One frame: its captured head `data`, its whole length `len`, at `unix_ns`.
    pub fn frame(&mut self, unix_ns: u128, data: &[u8], len: u32) -> io::Result<()> {
        let mut record = Vec::with_capacity(16 + data.len());
        record.extend_from_slice(&((unix_ns / 1_000_000_000) as u32).to_le_bytes());
        record.extend_from_slice(&((unix_ns % 1_000_000_000) as u32).to_le_bytes());
        record.extend_from_slice(&(data.len() as u32).to_le_bytes());
        record.extend_from_slice(&len.max(data.len() as u32).to_le_bytes());
        record.extend_from_slice(data);
        self.out.write_all(&record)
    }

    /// Writes what is buffered.
    pub fn flush(&mut self) -> io::Result<()> {
        self.out.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_frame_follows_the_file_header_with_its_lengths_and_time() {
        let mut p = Pcap::new(Vec::new(), 128).unwrap();
        p.frame(1_500_000_000_123, &[1, 2, 3], 60).unwrap();
        let b = p.out;
        assert_eq!(b.len(), 24 + 16 + 3);
        assert_eq!(&b[0..4], &MAGIC_NANOS.to_le_bytes());
        assert_eq!(u32::from_le_bytes(b[24..28].try_into().unwrap()), 1500);
        assert_eq!(u32::from_le_bytes(b[28..32].try_into().unwrap()), 123);
        assert_eq!(u32::from_le_bytes(b[32..36].try_into().unwrap()), 3);
        assert_eq!(u32::from_le_bytes(b[36..40].try_into().unwrap()), 60);
    }
}
