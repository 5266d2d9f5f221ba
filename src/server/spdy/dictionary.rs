//! The SPDY/3 header compression dictionary (draft-mbelshe-httpbis-spdy-00,
//! section 2.6.10.1), which both ends preset before their first header
//! block. Protocol data: it must match the peer's byte for byte.

// A line's leading space is written `\x20`: a continued line's leading
// whitespace is not part of the literal.
pub const DICTIONARY: &[u8] = b"\
\x00\x00\x00\x07options\x00\x00\x00\x04head\x00\x00\x00\x04post\x00\x00\x00\x03put\
\x00\x00\x00\x06delete\x00\x00\x00\x05trace\x00\x00\x00\x06accept\x00\x00\x00\x0eacc\
ept-charset\x00\x00\x00\x0faccept-encoding\x00\x00\x00\x0faccept-language\x00\x00\
\x00\x0daccept-ranges\x00\x00\x00\x03age\x00\x00\x00\x05allow\x00\x00\x00\x0dauthori\
zation\x00\x00\x00\x0dcache-control\x00\x00\x00\x0aconnection\x00\x00\x00\x0ccontent\
-base\x00\x00\x00\x10content-encoding\x00\x00\x00\x10content-language\x00\x00\x00\
\x0econtent-length\x00\x00\x00\x10content-location\x00\x00\x00\x0bcontent-md5\x00\
\x00\x00\x0dcontent-range\x00\x00\x00\x0ccontent-type\x00\x00\x00\x04date\x00\x00\
\x00\x04etag\x00\x00\x00\x06expect\x00\x00\x00\x07expires\x00\x00\x00\x04from\x00\
\x00\x00\x04host\x00\x00\x00\x08if-match\x00\x00\x00\x11if-modified-since\x00\x00\
\x00\x0dif-none-match\x00\x00\x00\x08if-range\x00\x00\x00\x13if-unmodified-since\x00\
\x00\x00\x0dlast-modified\x00\x00\x00\x08location\x00\x00\x00\x0cmax-forwards\x00\
\x00\x00\x06pragma\x00\x00\x00\x12proxy-authenticate\x00\x00\x00\x13proxy-authorizat\
ion\x00\x00\x00\x05range\x00\x00\x00\x07referer\x00\x00\x00\x0bretry-after\x00\x00\
\x00\x06server\x00\x00\x00\x02te\x00\x00\x00\x07trailer\x00\x00\x00\x11transfer-enco\
ding\x00\x00\x00\x07upgrade\x00\x00\x00\x0auser-agent\x00\x00\x00\x04vary\x00\x00\
\x00\x03via\x00\x00\x00\x07warning\x00\x00\x00\x10www-authenticate\x00\x00\x00\x06me\
thod\x00\x00\x00\x03get\x00\x00\x00\x06status\x00\x00\x00\x06200 OK\x00\x00\x00\x07v\
ersion\x00\x00\x00\x08HTTP/1.1\x00\x00\x00\x03url\x00\x00\x00\x06public\x00\x00\x00\
\x0aset-cookie\x00\x00\x00\x0akeep-alive\x00\x00\x00\x06origin1001012012022052063003\
02303304305306307402405406407408409410411412413414415416417502504505203 Non-Authorit\
ative Information204 No Content301 Moved Permanently400 Bad Request401 Unauthorized4\
03 Forbidden404 Not Found500 Internal Server Error501 Not Implemented503 Service Una\
vailableJan Feb Mar Apr May Jun Jul Aug Sept Oct Nov Dec 00:00:00 Mon, Tue, Wed, Thu\
, Fri, Sat, Sun, GMTchunked,text/html,image/png,image/jpg,image/gif,application/xml,\
application/xhtml+xml,text/plain,text/javascript,publicprivatemax-age=gzip,deflate,s\
dchcharset=utf-8charset=iso-8859-1,utf-,*,enq=0.";

/// Its Adler-32: the DICTID a zlib header names it by.
pub const ADLER32: u32 = 0xe3c6a7c2;

#[cfg(test)]
mod tests {
    #[test]
    fn the_checksum_is_the_dictionarys() {
        let (mut a, mut b) = (1u32, 0u32);
        for byte in super::DICTIONARY {
            a = (a + u32::from(*byte)) % 65521;
            b = (b + a) % 65521;
        }
        assert_eq!(super::DICTIONARY.len(), 1423);
        assert_eq!(b << 16 | a, super::ADLER32);
    }
}
