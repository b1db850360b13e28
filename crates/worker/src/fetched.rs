//! An artifact received from the control plane in chunks (`FetchArtifact`), checked as it
//! comes. The control plane is a peer: what the worker holds is bounded by the size it
//! announced with the first chunk, and that by [`MAX_ARTIFACT_BYTES`], whatever it sends.

use toolgrid_core::artifact::MAX_ARTIFACT_BYTES;

/// Why the chunks received are not an artifact.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum FetchRefused {
    #[error(
        "the control plane announced {0} bytes, more than the {MAX_ARTIFACT_BYTES} an artifact may have"
    )]
    TooLarge(u64),
    #[error("the control plane announced {announced} bytes, then {now}")]
    SizeChanged { announced: u64, now: u64 },
    #[error("the control plane sent more than the {0} bytes it announced")]
    MoreThanAnnounced(u64),
    #[error("the control plane's stream ended after {got} of the {announced} bytes it announced")]
    Short { got: u64, announced: u64 },
}

/// The bytes of one artifact received so far.
#[derive(Debug, Default)]
pub struct Fetched {
    /// The size the first chunk announced.
    announced: Option<u64>,
    bytes: Vec<u8>,
}

impl Fetched {
    /// Adds a chunk: `data`, of an artifact of `total_size` bytes. The first chunk's size
    /// is reserved at once, so the bytes are never moved while they grow.
    pub fn push(&mut self, total_size: u64, data: &[u8]) -> Result<(), FetchRefused> {
        let announced = match self.announced {
            None if total_size > MAX_ARTIFACT_BYTES => {
                return Err(FetchRefused::TooLarge(total_size));
            }
            None => {
                // At most MAX_ARTIFACT_BYTES, which fits.
                self.bytes
                    .reserve_exact(usize::try_from(total_size).unwrap_or(usize::MAX));
                self.announced = Some(total_size);
                total_size
            }
            Some(announced) if announced != total_size => {
                return Err(FetchRefused::SizeChanged {
                    announced,
                    now: total_size,
                });
            }
            Some(announced) => announced,
        };
        if self.bytes.len() as u64 + data.len() as u64 > announced {
            return Err(FetchRefused::MoreThanAnnounced(announced));
        }
        self.bytes.extend_from_slice(data);
        Ok(())
    }

    /// The artifact, once every byte announced has come (none announced: empty).
    pub fn finish(self) -> Result<Vec<u8>, FetchRefused> {
        let announced = self.announced.unwrap_or(0);
        let got = self.bytes.len() as u64;
        if got != announced {
            return Err(FetchRefused::Short { got, announced });
        }
        Ok(self.bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_make_the_artifact_they_announced() {
        let mut fetched = Fetched::default();
        fetched.push(5, b"abc").unwrap();
        fetched.push(5, b"de").unwrap();
        let bytes = fetched.finish().unwrap();
        assert_eq!(bytes, b"abcde");
        assert_eq!(bytes.capacity(), 5, "reserved once, at the announced size");
        assert_eq!(Fetched::default().finish().unwrap(), b"");
    }

    #[test]
    fn what_the_control_plane_may_not_send_is_refused_by_name() {
        let mut fetched = Fetched::default();
        assert_eq!(
            fetched.push(MAX_ARTIFACT_BYTES + 1, b"a"),
            Err(FetchRefused::TooLarge(MAX_ARTIFACT_BYTES + 1))
        );

        let mut fetched = Fetched::default();
        fetched.push(4, b"ab").unwrap();
        assert_eq!(
            fetched.push(5, b"c"),
            Err(FetchRefused::SizeChanged {
                announced: 4,
                now: 5
            })
        );
        assert_eq!(
            fetched.push(4, b"cde"),
            Err(FetchRefused::MoreThanAnnounced(4))
        );
        fetched.push(4, b"c").unwrap();
        assert_eq!(
            fetched.finish(),
            Err(FetchRefused::Short {
                got: 3,
                announced: 4
            })
        );
    }
}
