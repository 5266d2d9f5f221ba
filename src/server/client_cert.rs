//! Who a client certificate names: its subject's common name is the user
//! and each organization a group, as the API server and upstream's kubelet
//! map them. The chain has been verified by rustls already; this reads the
//! subject out of the DER, refusing anything it cannot walk.

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
const COMMON_NAME: &[u8] = &[0x55, 0x04, 0x03];
const ORGANIZATION: &[u8] = &[0x55, 0x04, 0x0a];

/// The subject's common name and organizations, in order.
pub fn subject(cert_der: &[u8]) -> Option<(String, Vec<String>)> {
    let certificate = Der(cert_der).expect(SEQUENCE)?;
    let mut tbs = Der(Der(certificate).expect(SEQUENCE)?);
    let mut field = tbs.next()?;
    // The explicit version, [0], is there for v2 and v3 certificates.
    if field.0 == 0xa0 {
        field = tbs.next()?;
    }
    // field is the serial number; then signature, issuer, validity.
    if field.0 != 0x02 {
        return None;
    }
    tbs.expect(SEQUENCE)?;
    tbs.expect(SEQUENCE)?;
    tbs.expect(SEQUENCE)?;
    let mut names = Der(tbs.expect(SEQUENCE)?);
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
    Some((common_name?, organizations))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cert(common_name: Option<&str>, organizations: &[&str]) -> Vec<u8> {
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
        let key = rcgen::KeyPair::generate().unwrap();
        params.self_signed(&key).unwrap().der().to_vec()
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
        }
        assert_eq!(subject(b"\x30\x84\xff\xff\xff\xff"), None);
    }
}
