//! Protobuf's wire format, the little of it nanolet reads and writes by
//! hand (Kubernetes objects' metadata, gRPC health checks, the device
//! plugin API): a message's fields in order, varints, length-delimited
//! fields. Every length is checked against the bytes there are; nothing
//! recurses and nothing is copied.

/// One field's value.
pub enum Value<'a> {
    Varint(u64),
    /// A string, bytes or an embedded message.
    Bytes(&'a [u8]),
    /// 32- or 64-bit values, which no reader here needs.
    Fixed,
}

/// The byte where a message stops making sense.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Malformed(pub usize);

/// A message's fields, read in order.
pub struct Fields<'a> {
    message: &'a [u8],
    at: usize,
}

pub fn fields(message: &[u8]) -> Fields<'_> {
    Fields { message, at: 0 }
}

impl<'a> Fields<'a> {
    /// The next field's number and value, `None` at the end.
    pub fn next_field(&mut self) -> Result<Option<(u32, Value<'a>)>, Malformed> {
        if self.at >= self.message.len() {
            return Ok(None);
        }
        let start = self.at;
        let key = self.varint()?;
        let number = u32::try_from(key >> 3).map_err(|_| Malformed(start))?;
        let value = match key & 7 {
            0 => Value::Varint(self.varint()?),
            1 => {
                self.take(8)?;
                Value::Fixed
            }
            2 => {
                let len = self.varint()?;
                Value::Bytes(self.take(len)?)
            }
            5 => {
                self.take(4)?;
                Value::Fixed
            }
            _ => return Err(Malformed(start)),
        };
        Ok(Some((number, value)))
    }

    fn varint(&mut self) -> Result<u64, Malformed> {
        let mut value = 0u64;
        for i in 0..10 {
            let Some(&byte) = self.message.get(self.at + i) else {
                break;
            };
            value |= u64::from(byte & 0x7f) << (7 * i);
            if byte & 0x80 == 0 {
                self.at += i + 1;
                return Ok(value);
            }
        }
        Err(Malformed(self.at))
    }

    fn take(&mut self, n: u64) -> Result<&'a [u8], Malformed> {
        let end = usize::try_from(n)
            .ok()
            .and_then(|n| self.at.checked_add(n))
            .filter(|&end| end <= self.message.len())
            .ok_or(Malformed(self.at))?;
        let taken = &self.message[self.at..end];
        self.at = end;
        Ok(taken)
    }
}

pub fn put_varint(out: &mut Vec<u8>, mut value: u64) {
    while value >= 0x80 {
        out.push((value as u8 & 0x7f) | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

/// A length-delimited field: a string, bytes or an embedded message.
pub fn put_bytes(out: &mut Vec<u8>, number: u32, bytes: &[u8]) {
    put_varint(out, (u64::from(number) << 3) | 2);
    put_varint(out, bytes.len() as u64);
    out.extend_from_slice(bytes);
}

/// A varint field.
pub fn put_uint(out: &mut Vec<u8>, number: u32, value: u64) {
    put_varint(out, u64::from(number) << 3);
    put_varint(out, value);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_are_read_as_written_and_lengths_checked() {
        let mut message = Vec::new();
        put_bytes(&mut message, 1, b"serial-0");
        put_uint(&mut message, 3, 300);
        let mut read = fields(&message);
        assert!(matches!(
            read.next_field(),
            Ok(Some((1, Value::Bytes(b"serial-0"))))
        ));
        assert!(matches!(
            read.next_field(),
            Ok(Some((3, Value::Varint(300))))
        ));
        assert!(matches!(read.next_field(), Ok(None)));
        // Cut anywhere inside a field, the message is malformed.
        for end in 1..message.len() {
            let mut read = fields(&message[..end]);
            let mut result = read.next_field();
            while let Ok(Some(_)) = result {
                result = read.next_field();
            }
            assert!(end == 10 || result.is_err(), "{end}");
        }
        // A length at the maximum; a varint that never ends.
        let huge = [
            0x0a, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01,
        ];
        assert!(fields(&huge).next_field().is_err());
        assert!(
            fields(&[
                0x08, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80
            ])
            .next_field()
            .is_err()
        );
    }
}
