//! zstd-compressed layers (`application/vnd.oci.image.layer.v1.tar+zstd`),
//! decoded as a stream with ruzstd (pure Rust: no C build for ARM). A
//! stream may hold several frames (containerd's zstd:chunked writes one per
//! chunk) and skippable frames between them; ruzstd's own reader stops
//! after the first, so the frames are walked here.

use std::io::{self, BufRead, Read};

use ruzstd::decoding::errors::{FrameDecoderError, ReadFrameHeaderError};
use ruzstd::decoding::{BlockDecodingStrategy, FrameDecoder};

/// The largest window a layer may ask for: memory for it is allocated up
/// front, and boards are small. zstd's levels use at most 8 MiB without
/// `--long`; `--long` itself (128 MiB) is refused.
const MAX_WINDOW: u64 = 32 << 20;

pub struct ZstdReader<R: BufRead> {
    source: R,
    decoder: FrameDecoder,
    in_frame: bool,
}

impl<R: BufRead> ZstdReader<R> {
    pub fn new(source: R) -> Self {
        let mut decoder = FrameDecoder::new();
        decoder.set_max_window_size(MAX_WINDOW);
        ZstdReader {
            source,
            decoder,
            in_frame: false,
        }
    }

    /// Starts the next frame; false at the end of the stream.
    fn next_frame(&mut self) -> io::Result<bool> {
        loop {
            if self.source.fill_buf()?.is_empty() {
                return Ok(false);
            }
            match self.decoder.reset(&mut self.source) {
                Ok(()) => return Ok(true),
                Err(FrameDecoderError::ReadFrameHeaderError(ReadFrameHeaderError::SkipFrame {
                    length,
                    ..
                })) => {
                    let skipped =
                        io::copy(&mut (&mut self.source).take(length.into()), &mut io::sink())?;
                    if skipped < u64::from(length) {
                        return Err(invalid("truncated skippable frame"));
                    }
                }
                Err(e) => return Err(invalid(e)),
            }
        }
    }
}

fn invalid(e: impl std::fmt::Display) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, format!("zstd: {e}"))
}

impl<R: BufRead> Read for ZstdReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        loop {
            if !self.in_frame {
                if !self.next_frame()? {
                    return Ok(0);
                }
                self.in_frame = true;
            }
            while self.decoder.can_collect() == 0 && !self.decoder.is_finished() {
                self.decoder
                    .decode_blocks(&mut self.source, BlockDecodingStrategy::UptoBlocks(1))
                    .map_err(invalid)?;
            }
            let n = self.decoder.read(buf)?;
            if n > 0 {
                return Ok(n);
            }
            if self.decoder.is_finished() {
                if let (Some(stated), Some(computed)) = (
                    self.decoder.get_checksum_from_data(),
                    self.decoder.get_calculated_checksum(),
                ) && stated != computed
                {
                    return Err(invalid("content checksum mismatch"));
                }
                self.in_frame = false;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Compressed by the zstd command line tool, as layers are built.
    fn zstd_cli(input: &[u8], args: &[&str]) -> Vec<u8> {
        use std::io::Write;
        let mut child = std::process::Command::new("zstd")
            .args(args)
            .args(["-c", "-q"])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("zstd (scripts/install-deps.sh installs it)");
        let mut stdin = child.stdin.take().unwrap();
        let data = input.to_vec();
        let writer = std::thread::spawn(move || stdin.write_all(&data));
        let out = child.wait_with_output().unwrap();
        writer.join().unwrap().unwrap();
        assert!(out.status.success());
        out.stdout
    }

    fn decode(data: &[u8]) -> io::Result<Vec<u8>> {
        let mut out = Vec::new();
        ZstdReader::new(io::BufReader::new(data)).read_to_end(&mut out)?;
        Ok(out)
    }

    #[test]
    fn frames_in_a_row_skippable_ones_and_damage() {
        let text: Vec<u8> = (0..200_000u32).flat_map(|i| i.to_le_bytes()).collect();
        let one = zstd_cli(&text, &["-3"]);
        assert_eq!(decode(&one).unwrap(), text);
        // Two frames with a skippable frame between: one stream.
        let mut many = zstd_cli(&text[..400_000], &["-1"]);
        many.extend_from_slice(&[0x50, 0x2a, 0x4d, 0x18, 3, 0, 0, 0, 1, 2, 3]);
        many.extend(zstd_cli(&text[400_000..], &["-19"]));
        assert_eq!(decode(&many).unwrap(), text);
        // A flipped byte inside: an error, not garbage.
        let mut damaged = one.clone();
        let middle = damaged.len() / 2;
        damaged[middle] ^= 0xff;
        assert!(decode(&damaged).is_err());
        // A window beyond what a board should allocate.
        let long = zstd_cli(&text, &["--long=28", "-1"]);
        let err = decode(&long).unwrap_err();
        assert!(err.to_string().contains("zstd"), "{err}");
    }
}
