//! What the agent reads out of an X.509 certificate: its subject (who a
//! client certificate names), its validity (when to rotate, whether the
//! clock can be right) and its public key (whether an issued certificate
//! is for the key made here). Certificates come from clients and from the
//! API server: a small DER walk that refuses what it cannot read, instead
//! of a general parser in a binary with a size budget.

/// One DER element at a time: (tag, contents).
struct Der<'a>(&'a [u8]);

impl<'a> Der<'a> {
    fn next(&mut self) -> Option<(u8, &'a [u8])> {
        let (&tag, rest) = self.0.split_first()?;
        // Multi-byte tags never occur where this reads.
        if tag & 0x1f == 0x1f {
            return None;
        }
        let (&first, mut rest) = rest.split_first()?;
        let len = if first < 0x80 {
            usize::from(first)
        } else {
            let n = usize::from(first & 0x7f);
            if n == 0 || n > 4 || rest.len() < n {
                return None;
            }
            let len = rest[..n]
                .iter()
                .fold(0usize, |acc, b| (acc << 8) | usize::from(*b));
            rest = &rest[n..];
            len
        };
        if rest.len() < len {
            return None;
        }
        let (contents, after) = rest.split_at(len);
        self.0 = after;
        Some((tag, contents))
    }

    fn expect(&mut self, tag: u8) -> Option<&'a [u8]> {
        self.next().filter(|(t, _)| *t == tag).map(|(_, c)| c)
    }
}

const SEQUENCE: u8 = 0x30;
const SET: u8 = 0x31;
const OID: u8 = 0x06;
const INTEGER: u8 = 0x02;
const BIT_STRING: u8 = 0x03;
const UTC_TIME: u8 = 0x17;
const GENERALIZED_TIME: u8 = 0x18;
const COMMON_NAME: &[u8] = &[0x55, 0x04, 0x03];
const ORGANIZATION: &[u8] = &[0x55, 0x04, 0x0a];

/// The parts of a certificate the agent uses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Certificate {
    /// Seconds since the epoch.
    pub not_before: i64,
    pub not_after: i64,
    /// The subject's common name, if it has one.
    pub common_name: Option<String>,
    pub organizations: Vec<String>,
    /// The subjectPublicKey bits: for an EC key, its point.
    pub public_key: Vec<u8>,
}

/// The fields of the TBSCertificate up to the public key.
struct Fields<'a> {
    validity: &'a [u8],
    subject: &'a [u8],
    public_key_info: &'a [u8],
}

fn fields(cert_der: &[u8]) -> Option<Fields<'_>> {
    let certificate = Der(cert_der).expect(SEQUENCE)?;
    let mut tbs = Der(Der(certificate).expect(SEQUENCE)?);
    let mut field = tbs.next()?;
    // The explicit version, [0], is there for v2 and v3 certificates.
    if field.0 == 0xa0 {
        field = tbs.next()?;
    }
    if field.0 != INTEGER {
        return None;
    }
    // The signature algorithm, then the issuer.
    tbs.expect(SEQUENCE)?;
    tbs.expect(SEQUENCE)?;
    Some(Fields {
        validity: tbs.expect(SEQUENCE)?,
        subject: tbs.expect(SEQUENCE)?,
        public_key_info: tbs.expect(SEQUENCE)?,
    })
}

/// The subject's common name and organizations, in order.
fn names(subject: &[u8]) -> Option<(Option<String>, Vec<String>)> {
    let mut names = Der(subject);
    let mut common_name = None;
    let mut organizations = Vec::new();
    while !names.0.is_empty() {
        let mut set = Der(names.expect(SET)?);
        while !set.0.is_empty() {
            let mut attribute = Der(set.expect(SEQUENCE)?);
            let oid = attribute.expect(OID)?;
            let (tag, value) = attribute.next()?;
            // UTF8String, PrintableString, TeletexString, IA5String.
            if !matches!(tag, 0x0c | 0x13 | 0x14 | 0x16) {
                continue;
            }
            let text = String::from_utf8_lossy(value).into_owned();
            match oid {
                COMMON_NAME if common_name.is_none() => common_name = Some(text),
                ORGANIZATION => organizations.push(text),
                _ => {}
            }
        }
    }
    Some((common_name, organizations))
}

/// A UTCTime (YYMMDDHHMMSSZ, years 1950–2049) or GeneralizedTime
/// (YYYYMMDDHHMMSSZ), as RFC 5280 requires them: in seconds since the epoch.
fn time(tag: u8, value: &[u8]) -> Option<i64> {
    let digits = value.strip_suffix(b"Z")?;
    if !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let number = |range: std::ops::Range<usize>| -> Option<i64> {
        digits
            .get(range)?
            .iter()
            .try_fold(0i64, |acc, d| Some(acc * 10 + i64::from(d - b'0')))
    };
    let (year, rest) = match (tag, digits.len()) {
        (UTC_TIME, 12) => {
            let yy = number(0..2)?;
            (if yy < 50 { 2000 + yy } else { 1900 + yy }, 2)
        }
        (GENERALIZED_TIME, 14) => (number(0..4)?, 4),
        _ => return None,
    };
    let field = |i: usize| number(rest + 2 * i..rest + 2 * i + 2);
    let date = jiff::civil::Date::new(
        i16::try_from(year).ok()?,
        i8::try_from(field(0)?).ok()?,
        i8::try_from(field(1)?).ok()?,
    )
    .ok()?;
    let (hour, minute, second) = (field(2)?, field(3)?, field(4)?);
    if hour > 23 || minute > 59 || second > 59 {
        return None;
    }
    let days = i64::from(date.since(jiff::civil::date(1970, 1, 1)).ok()?.get_days());
    Some(days * 86_400 + hour * 3_600 + minute * 60 + second)
}

/// Reads a certificate's subject, validity and public key, or nothing if
/// any of them cannot be read.
pub fn parse(cert_der: &[u8]) -> Option<Certificate> {
    let fields = fields(cert_der)?;
    let mut validity = Der(fields.validity);
    let (tag, value) = validity.next()?;
    let not_before = time(tag, value)?;
    let (tag, value) = validity.next()?;
    let not_after = time(tag, value)?;
    let (common_name, organizations) = names(fields.subject)?;
    let mut key_info = Der(fields.public_key_info);
    key_info.expect(SEQUENCE)?;
    // The first byte of a BIT STRING counts its unused bits: none in a key.
    let public_key = match key_info.expect(BIT_STRING)?.split_first()? {
        (0, bits) => bits.to_vec(),
        _ => return None,
    };
    Some(Certificate {
        not_before,
        not_after,
        common_name,
        organizations,
        public_key,
    })
}

/// The subject's common name and organizations, in order, if it names
/// someone: who a client certificate authenticates.
pub fn subject(cert_der: &[u8]) -> Option<(String, Vec<String>)> {
    let (common_name, organizations) = names(fields(cert_der)?.subject)?;
    Some((common_name?, organizations))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(common_name: Option<&str>, organizations: &[&str]) -> rcgen::CertificateParams {
        let mut params = rcgen::CertificateParams::new(vec!["client".into()]).unwrap();
        params.distinguished_name = rcgen::DistinguishedName::new();
        if let Some(cn) = common_name {
            params
                .distinguished_name
                .push(rcgen::DnType::CommonName, cn);
        }
        // rcgen keeps one value per type: a second O goes in under its
        // OID as a type of its own.
        for (i, o) in organizations.iter().enumerate() {
            let kind = match i {
                0 => rcgen::DnType::OrganizationName,
                _ => rcgen::DnType::CustomDnType(vec![2, 5, 4, 10]),
            };
            params.distinguished_name.push(kind, *o);
        }
        params
    }

    fn cert(common_name: Option<&str>, organizations: &[&str]) -> Vec<u8> {
        let key = rcgen::KeyPair::generate().unwrap();
        params(common_name, organizations)
            .self_signed(&key)
            .unwrap()
            .der()
            .to_vec()
    }

    #[test]
    fn the_common_name_is_the_user_and_organizations_the_groups() {
        let der = cert(Some("system:node:edge-1"), &["system:nodes", "edge-fleet"]);
        assert_eq!(
            subject(&der),
            Some((
                "system:node:edge-1".into(),
                vec!["system:nodes".into(), "edge-fleet".into()]
            ))
        );
        assert_eq!(
            subject(&cert(Some("alice"), &[])),
            Some(("alice".into(), vec![]))
        );
    }

    #[test]
    fn no_common_name_or_broken_der_names_nobody() {
        assert_eq!(subject(&cert(None, &["system:masters"])), None);
        let der = cert(Some("alice"), &[]);
        for cut in [0, 1, 5, der.len() / 2, der.len() - 1] {
            // Truncated, the outer length no longer fits: nothing is read.
            assert_eq!(subject(&der[..cut]), None, "cut at {cut}");
            assert_eq!(parse(&der[..cut]), None, "cut at {cut}");
        }
        assert_eq!(subject(b"\x30\x84\xff\xff\xff\xff"), None);
    }

    #[test]
    fn validity_and_public_key_are_read() {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut p = params(Some("system:node:edge-1"), &["system:nodes"]);
        // UTCTime before 2050, GeneralizedTime from 2050 on (RFC 5280).
        p.not_before = rcgen::date_time_ymd(1999, 12, 31);
        p.not_after = rcgen::date_time_ymd(2051, 3, 1);
        let der = p.self_signed(&key).unwrap().der().to_vec();
        let c = parse(&der).unwrap();
        assert_eq!(c.not_before, 946_598_400);
        assert_eq!(c.not_after, 2_561_241_600);
        assert_eq!(c.common_name.as_deref(), Some("system:node:edge-1"));
        assert_eq!(c.organizations, ["system:nodes"]);
        assert_eq!(c.public_key, key.public_key_raw());
    }

    #[test]
    fn times_out_of_range_are_refused() {
        assert_eq!(time(UTC_TIME, b"700101000000Z"), Some(0));
        assert_eq!(time(UTC_TIME, b"491231235959Z"), Some(2_524_607_999));
        assert_eq!(time(GENERALIZED_TIME, b"19700101000001Z"), Some(1));
        for bad in [
            &b"701301000000Z"[..],
            b"700132000000Z",
            b"700101240000Z",
            b"700101006000Z",
            b"700101000060Z",
            b"700101000000",
            b"7001010000+0Z",
            b"700101000000.5Z",
            b"",
        ] {
            assert_eq!(
                time(UTC_TIME, bad),
                None,
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
        assert_eq!(time(GENERALIZED_TIME, b"700101000000Z"), None);
        assert_eq!(time(0x04, b"700101000000Z"), None);
        assert_eq!(
            time(GENERALIZED_TIME, b"99991231235959Z"),
            Some(253_402_300_799)
        );
    }
}
