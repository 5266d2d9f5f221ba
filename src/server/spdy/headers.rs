//! SPDY/3 header blocks: a count and length-prefixed names and values,
//! compressed as one zlib stream per direction and connection, primed with
//! the protocol's dictionary. miniz_oxide has no preset dictionaries; a
//! preset dictionary is only the window's first contents, so the inflater
//! keeps its own 32 KiB window and starts it with the dictionary. What we
//! send is not compressed: stored deflate blocks, which every inflater
//! reads, and a handful of bytes per stream.

use miniz_oxide::inflate::TINFLStatus;
use miniz_oxide::inflate::core::{DecompressorOxide, decompress, inflate_flags};

use super::SpdyError;

const WINDOW: usize = 32 * 1024;

/// The largest header block we inflate: the streams' headers are a few
/// short pairs.
const MAX_HEADERS: usize = 64 * 1024;

/// Inflates one connection's header blocks, in order.
pub struct Inflater {
    state: Box<DecompressorOxide>,
    window: Box<[u8]>,
    position: usize,
    /// The zlib header is read from the first block only.
    started: bool,
}

impl Default for Inflater {
    fn default() -> Self {
        let mut window = vec![0u8; WINDOW].into_boxed_slice();
        window[..super::dictionary::DICTIONARY.len()]
            .copy_from_slice(super::dictionary::DICTIONARY);
        Inflater {
            state: Box::default(),
            window,
            position: super::dictionary::DICTIONARY.len(),
            started: false,
        }
    }
}

impl Inflater {
    pub fn inflate(&mut self, mut input: &[u8]) -> Result<Vec<u8>, SpdyError> {
        if !self.started {
            let [cmf, flg, rest @ ..] = input else {
                return Err(SpdyError::Headers("a header block without its zlib header"));
            };
            if cmf & 0x0F != 8 || (u16::from(*cmf) << 8 | u16::from(*flg)) % 31 != 0 {
                return Err(SpdyError::Headers("not a zlib stream"));
            }
            input = rest;
            if flg & 0x20 != 0 {
                let (id, rest) = input
                    .split_at_checked(4)
                    .ok_or(SpdyError::Headers("a short zlib header"))?;
                if u32::from_be_bytes([id[0], id[1], id[2], id[3]]) != super::dictionary::ADLER32 {
                    return Err(SpdyError::Headers("compressed with another dictionary"));
                }
                input = rest;
            }
            self.started = true;
        }
        let mut out = Vec::new();
        loop {
            let (status, used, produced) = decompress(
                &mut self.state,
                input,
                &mut self.window,
                self.position,
                inflate_flags::TINFL_FLAG_HAS_MORE_INPUT,
            );
            out.extend_from_slice(&self.window[self.position..self.position + produced]);
            self.position = (self.position + produced) & (WINDOW - 1);
            input = &input[used..];
            if out.len() > MAX_HEADERS {
                return Err(SpdyError::Headers("a header block too large"));
            }
            match status {
                TINFLStatus::HasMoreOutput => continue,
                TINFLStatus::NeedsMoreInput if input.is_empty() => return Ok(out),
                TINFLStatus::NeedsMoreInput => continue,
                TINFLStatus::Done => return Err(SpdyError::Headers("the zlib stream ended")),
                _ => return Err(SpdyError::Headers("corrupt compressed headers")),
            }
        }
    }
}

/// Wraps header blocks as stored deflate blocks of one zlib stream.
#[derive(Default)]
pub struct Deflater {
    started: bool,
}

impl Deflater {
    pub fn deflate(&mut self, block: &[u8]) -> Vec<u8> {
        let mut out = Vec::with_capacity(block.len() + 8);
        if !self.started {
            // Deflate with a 32 KiB window, no dictionary; 0x7801 % 31 == 0.
            out.extend_from_slice(&[0x78, 0x01]);
            self.started = true;
        }
        // Never the final block: the stream goes on with the next frame.
        // The empty block after the data is what a sync flush writes; Go's
        // inflater hands over what it has only at a block like it, and
        // otherwise reads on into the next frame, and fails.
        for chunk in block.chunks(u16::MAX as usize).chain([&[][..]]) {
            let len = chunk.len() as u16;
            out.push(0);
            out.extend_from_slice(&len.to_le_bytes());
            out.extend_from_slice(&(!len).to_le_bytes());
            out.extend_from_slice(chunk);
        }
        out
    }
}

/// Names are lowercase on the wire, as SPDY/3 requires.
pub fn encode(pairs: &[(&str, &str)]) -> Vec<u8> {
    let mut out = Vec::new();
    out.extend_from_slice(&(pairs.len() as u32).to_be_bytes());
    for (name, value) in pairs {
        let name = name.to_ascii_lowercase();
        out.extend_from_slice(&(name.len() as u32).to_be_bytes());
        out.extend_from_slice(name.as_bytes());
        out.extend_from_slice(&(value.len() as u32).to_be_bytes());
        out.extend_from_slice(value.as_bytes());
    }
    out
}

/// At most this many name-value pairs in a block, NUL-split values
/// counted one by one.
const MAX_PAIRS: usize = 128;

/// Names lowercased; a value with NULs is several values of one name.
/// What it returns is at most [`MAX_PAIRS`] pairs of at most
/// [`MAX_HEADERS`] bytes in all: a value split on NULs repeats its name
/// per piece, which 64 KiB of block would otherwise make a gigabyte of.
pub fn decode(mut block: &[u8]) -> Result<Vec<(String, String)>, SpdyError> {
    let mut take = |n: usize| -> Result<&[u8], SpdyError> {
        let (head, rest) = block
            .split_at_checked(n)
            .ok_or(SpdyError::Headers("a truncated header block"))?;
        block = rest;
        Ok(head)
    };
    let number = |b: &[u8]| u32::from_be_bytes([b[0], b[1], b[2], b[3]]) as usize;
    let count = number(take(4)?);
    let mut pairs = Vec::new();
    let mut size = 0usize;
    for _ in 0..count {
        let len = number(take(4)?);
        let name = String::from_utf8_lossy(take(len)?).to_ascii_lowercase();
        let len = number(take(4)?);
        let value = String::from_utf8_lossy(take(len)?).into_owned();
        for one in value.split('\0') {
            size = size.saturating_add(name.len() + one.len());
            if pairs.len() == MAX_PAIRS || size > MAX_HEADERS {
                return Err(SpdyError::Headers("too many headers"));
            }
            pairs.push((name.clone(), one.to_owned()));
        }
    }
    Ok(pairs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_decode_what_they_encode() {
        let block = encode(&[("streamType", "stdin"), ("Port", "80\u{0}81")]);
        assert_eq!(
            decode(&block).unwrap(),
            vec![
                ("streamtype".into(), "stdin".into()),
                ("port".into(), "80".into()),
                ("port".into(), "81".into())
            ]
        );
        assert!(decode(&block[..block.len() - 1]).is_err());
    }

    /// ~100 compressed bytes, a 64 KiB block: a long name and a value of
    /// NULs repeat the name per piece (a gigabyte before the caps).
    #[test]
    fn values_split_on_nuls_cannot_multiply_their_name() {
        let name = "n".repeat(1000);
        let nuls = "\0".repeat(60_000);
        let block = encode(&[(&name, &nuls)]);
        assert!(decode(&block).is_err());
        let many = "\0".repeat(MAX_PAIRS);
        assert!(decode(&encode(&[("port", &many)])).is_err());
        let enough = "\0".repeat(MAX_PAIRS - 1);
        assert_eq!(
            decode(&encode(&[("port", &enough)])).unwrap().len(),
            MAX_PAIRS
        );
    }

    #[test]
    fn stored_blocks_inflate_across_frames() {
        let mut deflater = Deflater::default();
        let mut inflater = Inflater::default();
        for n in 0..3 {
            let block = encode(&[("requestid", &n.to_string())]);
            let deflated = deflater.deflate(&block);
            assert!(deflated.ends_with(&[0, 0, 0, 0xFF, 0xFF]), "a sync flush");
            assert_eq!(inflater.inflate(&deflated).unwrap(), block);
        }
    }

    /// What a Go peer sends: zlib with the dictionary preset, each block
    /// ending in a sync flush. flate2's pure-Rust backend has no preset
    /// dictionary, but a compressor that compressed the dictionary first
    /// (that output dropped) refers back into it just the same.
    #[test]
    fn back_references_into_the_dictionary_resolve() {
        use flate2::{Compress, Compression, FlushCompress};
        let dictionary = super::super::dictionary::DICTIONARY;
        let mut compress = Compress::new(Compression::best(), false);
        let mut primed = Vec::with_capacity(2 * WINDOW);
        compress
            .compress_vec(dictionary, &mut primed, FlushCompress::Sync)
            .unwrap();
        let block = encode(&[("streamtype", "error"), ("content-type", "text/plain")]);
        let mut raw = Vec::with_capacity(WINDOW);
        compress
            .compress_vec(&block, &mut raw, FlushCompress::Sync)
            .unwrap();
        // The dictionary's own output is not sent: the receiver starts
        // with it in its window instead.
        let mut wire = vec![0x78, 0xF9];
        wire.extend_from_slice(&super::super::dictionary::ADLER32.to_be_bytes());
        wire.extend_from_slice(&raw);
        assert!(
            raw.len() < block.len(),
            "the block compressed against the dictionary"
        );
        let mut inflater = Inflater::default();
        assert_eq!(inflater.inflate(&wire).unwrap(), block);
    }

    #[test]
    fn another_dictionary_is_refused() {
        let mut inflater = Inflater::default();
        assert!(inflater.inflate(&[0x78, 0xF9, 0, 0, 0, 1, 0]).is_err());
    }
}
