//! Just enough of the Redis protocol (RESP2) for publish/subscribe: commands as arrays of
//! bulk strings, replies parsed from a buffered stream. Works with Redis and Valkey.

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};

/// Largest bulk string or array accepted from the server.
const MAX_LEN: usize = 64 << 20;

/// A reply from the server.
#[derive(Debug, PartialEq, Eq)]
pub enum Reply {
    /// `+OK`, `+PONG`.
    Status(String),
    /// `-ERR ...`
    Error(String),
    /// `:1`
    Integer(i64),
    /// `$3\r\nabc`, or `$-1` (nil).
    Bulk(Option<Vec<u8>>),
    /// `*3 ...`, or `*-1` (nil).
    Array(Vec<Reply>),
}

/// Why talking to the server failed.
#[derive(Debug, thiserror::Error)]
pub enum RespError {
    /// The connection failed.
    #[error("{0}")]
    Io(#[from] std::io::Error),
    /// The server sent something that is not RESP.
    #[error("protocol error: {0}")]
    Protocol(&'static str),
}

/// A connection, split so that one task may read while another writes.
pub struct Connection {
    /// Replies come from here.
    pub reader: Replies,
    /// Commands go here.
    pub writer: Commands,
}

impl Connection {
    /// Connects to `addr` (`host:port`).
    pub async fn connect(addr: &str) -> Result<Connection, RespError> {
        let stream = TcpStream::connect(addr).await?;
        stream.set_nodelay(true)?;
        let (read, write) = stream.into_split();
        Ok(Connection {
            reader: Replies(BufReader::new(read)),
            writer: Commands(write),
        })
    }
}

/// The writing half.
pub struct Commands(OwnedWriteHalf);

impl Commands {
    /// Sends one command.
    pub async fn send(&mut self, args: &[&[u8]]) -> Result<(), RespError> {
        let mut wire = Vec::with_capacity(16 + args.iter().map(|a| a.len() + 16).sum::<usize>());
        encode(&mut wire, args);
        self.0.write_all(&wire).await?;
        Ok(())
    }
}

/// Appends `args` to `wire` as one RESP command.
pub fn encode(wire: &mut Vec<u8>, args: &[&[u8]]) {
    wire.extend_from_slice(format!("*{}\r\n", args.len()).as_bytes());
    for arg in args {
        wire.extend_from_slice(format!("${}\r\n", arg.len()).as_bytes());
        wire.extend_from_slice(arg);
        wire.extend_from_slice(b"\r\n");
    }
}

/// The reading half.
pub struct Replies(BufReader<OwnedReadHalf>);

impl Replies {
    /// Reads the next reply.
    pub async fn next(&mut self) -> Result<Reply, RespError> {
        let mut depth: Vec<(usize, Vec<Reply>)> = Vec::new();
        loop {
            let reply = match self.item().await? {
                Item::Value(reply) => reply,
                Item::Array(0) => Reply::Array(Vec::new()),
                Item::Array(n) => {
                    depth.push((n, Vec::with_capacity(n.min(1024))));
                    continue;
                }
            };
            let Some(reply) = fold(&mut depth, reply) else {
                continue;
            };
            return Ok(reply);
        }
    }

    async fn item(&mut self) -> Result<Item, RespError> {
        let line = self.line().await?;
        let (kind, rest) = line
            .split_first()
            .ok_or(RespError::Protocol("empty line"))?;
        let text = || String::from_utf8_lossy(rest).into_owned();
        Ok(match kind {
            b'+' => Item::Value(Reply::Status(text())),
            b'-' => Item::Value(Reply::Error(text())),
            b':' => Item::Value(Reply::Integer(number(rest)?)),
            b'$' => match number(rest)? {
                -1 => Item::Value(Reply::Bulk(None)),
                n => Item::Value(Reply::Bulk(Some(self.bulk(length(n)?).await?))),
            },
            b'*' => match number(rest)? {
                -1 => Item::Value(Reply::Array(Vec::new())),
                n => Item::Array(length(n)?),
            },
            _ => return Err(RespError::Protocol("unknown reply type")),
        })
    }

    async fn line(&mut self) -> Result<Vec<u8>, RespError> {
        let mut line = Vec::new();
        let read = (&mut self.0)
            .take(MAX_LEN as u64)
            .read_until(b'\n', &mut line)
            .await?;
        if read == 0 {
            return Err(std::io::Error::from(std::io::ErrorKind::UnexpectedEof).into());
        }
        match line.strip_suffix(b"\r\n") {
            Some(body) => Ok(body.to_vec()),
            None => Err(RespError::Protocol("line without CRLF")),
        }
    }

    async fn bulk(&mut self, len: usize) -> Result<Vec<u8>, RespError> {
        let mut data = vec![0; len + 2];
        self.0.read_exact(&mut data).await?;
        if !data.ends_with(b"\r\n") {
            return Err(RespError::Protocol("bulk string without CRLF"));
        }
        data.truncate(len);
        Ok(data)
    }
}

enum Item {
    Value(Reply),
    Array(usize),
}

/// Adds `reply` to the innermost open array; returns the outermost reply once complete.
fn fold(depth: &mut Vec<(usize, Vec<Reply>)>, mut reply: Reply) -> Option<Reply> {
    loop {
        let Some((want, items)) = depth.last_mut() else {
            return Some(reply);
        };
        items.push(reply);
        if items.len() < *want {
            return None;
        }
        let (_, items) = depth.pop()?;
        reply = Reply::Array(items);
    }
}

fn number(text: &[u8]) -> Result<i64, RespError> {
    let text = std::str::from_utf8(text).map_err(|_| RespError::Protocol("bad number"))?;
    text.parse().map_err(|_| RespError::Protocol("bad number"))
}

fn length(n: i64) -> Result<usize, RespError> {
    usize::try_from(n)
        .ok()
        .filter(|&n| n <= MAX_LEN)
        .ok_or(RespError::Protocol("bad length"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Replies parsed from `bytes` served by a local socket.
    async fn parse(bytes: &'static [u8]) -> Vec<Result<Reply, String>> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.unwrap();
            s.write_all(bytes).await.unwrap();
        });
        let mut c = Connection::connect(&addr).await.unwrap();
        let mut out = Vec::new();
        loop {
            match c.reader.next().await {
                Ok(r) => out.push(Ok(r)),
                Err(e) => {
                    out.push(Err(e.to_string()));
                    return out;
                }
            }
        }
    }

    #[tokio::test]
    async fn parses_every_reply_type_and_nested_arrays() {
        let got = parse(b"+OK\r\n-ERR no\r\n:42\r\n$4\r\na\r\nb\r\n$-1\r\n*3\r\n$7\r\nmessage\r\n$1\r\nc\r\n*1\r\n:1\r\n*0\r\n").await;
        assert_eq!(got[0], Ok(Reply::Status("OK".into())));
        assert_eq!(got[1], Ok(Reply::Error("ERR no".into())));
        assert_eq!(got[2], Ok(Reply::Integer(42)));
        assert_eq!(got[3], Ok(Reply::Bulk(Some(b"a\r\nb".to_vec()))));
        assert_eq!(got[4], Ok(Reply::Bulk(None)));
        let message = Reply::Array(vec![
            Reply::Bulk(Some(b"message".to_vec())),
            Reply::Bulk(Some(b"c".to_vec())),
            Reply::Array(vec![Reply::Integer(1)]),
        ]);
        assert_eq!(got[5], Ok(message));
        assert_eq!(got[6], Ok(Reply::Array(Vec::new())));
        assert!(got[7].is_err(), "end of stream");
    }

    #[tokio::test]
    async fn refuses_what_is_not_resp() {
        for bad in [
            &b"?x\r\n"[..],
            b"$99999999999\r\n",
            b"$3\r\nabcd\r\n",
            b":x\r\n",
        ] {
            let bad: &'static [u8] = Box::leak(bad.to_vec().into_boxed_slice());
            let got = parse(bad).await;
            assert!(
                got[0].as_ref().is_err_and(|e| e.contains("protocol")),
                "{bad:?}: {got:?}"
            );
        }
    }

    #[test]
    fn encodes_commands_as_bulk_arrays() {
        let mut wire = Vec::new();
        encode(&mut wire, &[b"PUBLISH", b"ch", b"x\r\ny"]);
        assert_eq!(wire, b"*3\r\n$7\r\nPUBLISH\r\n$2\r\nch\r\n$4\r\nx\r\ny\r\n");
    }
}
