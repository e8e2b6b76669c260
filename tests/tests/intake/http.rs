//! The request line and headers as HTTP says; the script's ETags and codings per variant.

use super::*;

/// Raw HTTP/1.1 on a fresh connection: the status line and headers of the answer, read with
/// a bound (a server that waits for more would make this fail, not hang).
async fn raw_http(port: u16, request: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .unwrap();
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    let read = async {
        loop {
            let n = stream.read(&mut chunk).await.unwrap_or(0);
            buf.extend_from_slice(&chunk[..n]);
            if n == 0 || buf.windows(4).any(|w| w == b"\r\n\r\n") {
                break;
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(60), read)
        .await
        .unwrap_or_else(|_| panic!("no answer within 60 s to {request:?}"));
    String::from_utf8_lossy(&buf).into_owned()
}

/// Issue 13, kind 6: the request line and headers, as HTTP says.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_edges_are_answered_as_http_says() {
    let env = TestEnv::new(Stack::shared()).await;
    // A body timeout far beyond the test's patience: an answer proves nobody waited for it.
    let c = env.collector(&[("COLLECTOR_BODY_TIMEOUT", "1h")]).await;
    let head = raw_http(
        c.port,
        "POST /api/v1/measurements HTTP/1.1\r\nHost: x\r\nContent-Type: text/plain\r\nContent-Length: 1000000\r\n\r\n",
    )
    .await;
    assert!(head.starts_with("HTTP/1.1 413"), "{head}");
    // An empty Content-Type header, as some clients send it, is no content type.
    let (empty_id, m) = measurement(&env.site);
    let body = m.to_string();
    let head = raw_http(
        c.port,
        &format!(
            "POST /api/v1/measurements HTTP/1.1\r\nHost: x\r\nContent-Type:\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        ),
    )
    .await;
    assert!(head.starts_with("HTTP/1.1 202"), "{head}");

    let mut ids = vec![empty_id];
    let mut accepted = |headers: &'static [(&'static str, &'static str)]| {
        let (id, m) = measurement(&env.site);
        ids.push(id);
        (m.to_string(), headers)
    };
    for (body, headers) in [
        accepted(&[("content-type", "Application/JSON; Charset=\"UTF-8\"")]),
        accepted(&[("content-type", "text/plain; foo=bar;charset=utf8")]),
    ] {
        let (status, answer, _) = c.post(body, headers).await;
        assert_eq!(status, 202, "{headers:?}: {answer}");
    }
    let (gz_id, gz) = measurement(&env.site);
    ids.push(gz_id);
    let (status, answer, _) = c
        .post(
            gzip(gz.to_string().as_bytes()),
            &[("content-encoding", "GZIP")],
        )
        .await;
    assert_eq!(status, 202, "{answer}");
    let (status, answer, _) = c
        .post(
            measurement(&env.site).1.to_string(),
            &[("content-type", "text/plain; charset=iso-8859-1")],
        )
        .await;
    assert_eq!(status, 415, "{answer}");
    assert!(answer["error"].is_string());

    // Repeated and trailing slashes reach the intake; nothing redirects; every error is JSON.
    ids.extend(paths_as_http_says(&c, &env.site).await);
    env.wait_rows(&ids, VISIBLE).await;
}

/// Repeated and trailing slashes reach the intake of `c` (a beacon of `site` each: their ids);
/// nothing redirects; every error is JSON.
async fn paths_as_http_says(c: &Collector, site: &str) -> Vec<String> {
    let mut ids = Vec::new();
    for path in [
        "//api/v1/measurements",
        "/api/v1/measurements/",
        "//api//v1/measurements//",
    ] {
        let (id, m) = measurement(site);
        ids.push(id);
        let r = http()
            .post(format!("{}{path}", c.url))
            .body(m.to_string())
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 202, "{path}");
    }
    let no_redirects = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    for (method, path, want) in [
        ("GET", "/nope", 404),
        ("POST", "/api/v2/measurements", 404),
        ("GET", "/api/v1/measurements", 405),
        ("DELETE", "/script.js", 405),
        ("PUT", "//api/v1/measurements/", 405),
        ("GET", "/api/v1/sites/no-such-site", 404),
        ("GET", "/api/v1/sites/bad%20key", 404),
    ] {
        let r = no_redirects
            .request(method.parse().unwrap(), format!("{}{path}", c.url))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), want, "{method} {path}");
        assert_eq!(
            r.headers()["content-type"],
            "application/json",
            "{method} {path}"
        );
        let body: Value = r.json().await.unwrap();
        assert!(body["error"].is_string(), "{method} {path}: {body}");
    }
    let r = no_redirects
        .get(format!("{}//script.js/", c.url))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    ids
}

/// Issue 13, kind 7: a 304 only for the ETag of the variant this request would get, and the
/// coding chosen by q-values.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn script_etags_and_codings_are_per_variant() {
    let env = TestEnv::new(Stack::shared()).await;
    let c = env.collector(&[]).await;
    let get = |accept: Option<&'static str>, inm: Option<String>| {
        let mut req = http().get(format!("{}/script.js", c.url));
        if let Some(a) = accept {
            req = req.header("accept-encoding", a);
        }
        if let Some(i) = inm {
            req = req.header("if-none-match", i);
        }
        async move {
            let r = req.send().await.unwrap();
            let status = r.status().as_u16();
            let h = r.headers().clone();
            let coding = h
                .get("content-encoding")
                .map(|v| v.to_str().unwrap().to_owned());
            let etag = h["etag"].to_str().unwrap().to_owned();
            assert_eq!(h["vary"], "Accept-Encoding");
            (status, coding, etag)
        }
    };
    let (_, coding, plain) = get(None, None).await;
    assert_eq!(coding, None);
    let (_, coding, gz) = get(Some("gzip"), None).await;
    assert_eq!(coding.as_deref(), Some("gzip"));
    let (_, coding, br) = get(Some("gzip, br"), None).await;
    assert_eq!(coding.as_deref(), Some("br"));
    assert!(plain != gz && gz != br && plain != br);

    // The gzip variant's ETag from a client that does not accept gzip: a full answer.
    assert_eq!(
        get(None, Some(gz.clone())).await,
        (200, None, plain.clone())
    );
    assert_eq!(get(Some("br"), Some(gz.clone())).await.0, 200);
    assert_eq!(get(Some("gzip"), Some(gz.clone())).await.0, 304);
    assert_eq!(
        get(None, Some(format!("W/{plain}"))).await.0,
        304,
        "weak comparison"
    );
    assert_eq!(
        get(Some("gzip"), Some(format!("\"other\", W/{gz}")))
            .await
            .0,
        304
    );
    assert_eq!(get(Some("gzip"), Some("*".into())).await.0, 304);
    // q-values.
    for (accept, want) in [
        ("gzip;q=1, br;q=0.5", Some("gzip")),
        ("br;q=0, gzip", Some("gzip")),
        ("gzip;q=0", None),
        ("identity;q=1, gzip;q=0.5", None),
        ("*", Some("br")),
    ] {
        assert_eq!(get(Some(accept), None).await.1.as_deref(), want, "{accept}");
    }
}
