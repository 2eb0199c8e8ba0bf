use super::*;
use crate::console::server::Method;

const TOKEN: &str = "0123456789abcdef-token";
const NOW: Timestamp = Timestamp::from_millis(1_764_500_000_000);

fn req(headers: &[(&str, &str)]) -> Request {
    let mut r = Request::new(Method::Get, "/");
    r.headers = headers
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    r
}

fn with_token() -> Auth {
    Auth::new(Some(TOKEN.into()), "0.0.0.0:9464".parse().unwrap(), false)
}

/// The cookie header a Set-Cookie value sets.
fn cookie_of(set: &str) -> String {
    set.split(';').next().unwrap().to_string()
}

#[test]
fn loopback_without_a_token_admits_loopback_hosts_only() {
    let auth = Auth::new(None, "127.0.0.1:9464".parse().unwrap(), false);
    let now = Instant::now();
    for host in [
        "127.0.0.1:9464",
        "localhost:9464",
        "[::1]:9464",
        "localhost",
    ] {
        let access = auth.admit(&req(&[("host", host)]), now);
        assert!(matches!(access, Ok(Access::Anyone)), "{host}");
    }
    for host in ["evil.example:9464", "", "127.0.0.1.evil.example"] {
        assert!(matches!(
            auth.admit(&req(&[("host", host)]), now),
            Err(Refusal::Forbidden(_))
        ));
    }
}

#[test]
fn a_token_is_taken_as_bearer_or_session_cookie() {
    let auth = with_token();
    let now = Instant::now();
    let host = ("host", "10.1.2.3:9464");
    let admit = |headers: &[(&str, &str)]| auth.admit(&req(headers), now);
    assert_eq!(admit(&[host]).unwrap_err(), Refusal::Unauthenticated);
    let bearer = format!("Bearer {TOKEN}");
    assert!(matches!(
        admit(&[host, ("authorization", &bearer)]),
        Ok(Access::Bearer)
    ));
    assert_eq!(
        admit(&[host, ("authorization", "Bearer wrong")]).unwrap_err(),
        Refusal::Unauthenticated
    );
    assert_eq!(
        auth.login(&req(&[]), "wrong", false, now),
        Err(Refusal::Unauthenticated)
    );
    assert!(auth
        .login(&req(&[]), TOKEN, true, now)
        .unwrap()
        .ends_with("; Secure"));
    let set = auth.login(&req(&[]), TOKEN, false, now).unwrap();
    assert!(set.contains("HttpOnly") && set.contains("SameSite=Strict"));
    assert!(
        set.contains(&format!("; Max-Age={}", SESSION_LIFETIME.as_secs())),
        "{set}"
    );
    assert!(!set.contains(TOKEN), "the cookie does not carry the token");
    let cookie = format!("a=b; {}", cookie_of(&set));
    assert!(matches!(
        admit(&[host, ("cookie", &cookie)]),
        Ok(Access::Session(_))
    ));
    for forged in [
        "outboxd_session=00",
        "outboxd_session=",
        "outboxd_session=1.2.3",
    ] {
        assert_eq!(
            admit(&[host, ("cookie", forged)]).unwrap_err(),
            Refusal::Unauthenticated,
            "{forged}"
        );
    }
    // Another console (another process) does not know the session.
    let other = with_token();
    assert!(other
        .admit(&req(&[host, ("cookie", &cookie)]), now)
        .is_err());
}

#[test]
fn logging_out_ends_the_session_and_its_csrf_token() {
    let auth = with_token();
    let now = Instant::now();
    let a = cookie_of(&auth.login(&req(&[]), TOKEN, false, now).unwrap());
    let b = cookie_of(&auth.login(&req(&[]), TOKEN, false, now).unwrap());
    let session = |cookie: &str| auth.admit(&req(&[("cookie", cookie)]), now);
    let (Ok(access_a), Ok(access_b)) = (session(&a), session(&b)) else {
        panic!("both logged in");
    };
    let csrf_a = auth.csrf(&access_a).to_string();
    assert_ne!(csrf_a, auth.csrf(&access_b), "one token per session");
    let post = req(&[("host", "h:1"), ("origin", "http://h:1")]);
    let form = |csrf: &str| Params(vec![(CSRF_FIELD.into(), csrf.into())]);
    assert_eq!(auth.check_post(&post, &form(&csrf_a), &access_a), Ok(()));
    assert!(
        auth.check_post(&post, &form(&csrf_a), &access_b).is_err(),
        "another session's token is refused"
    );
    auth.logout(&access_a);
    assert_eq!(session(&a).unwrap_err(), Refusal::Unauthenticated);
    assert!(session(&b).is_ok(), "the other session goes on");
}

#[test]
fn a_session_expires_after_its_lifetime() {
    let auth = with_token();
    let now = Instant::now();
    let cookie = cookie_of(&auth.login(&req(&[]), TOKEN, false, now).unwrap());
    let at = |t: Instant| auth.admit(&req(&[("host", "h"), ("cookie", &cookie)]), t);
    assert!(at(now + SESSION_LIFETIME).is_ok());
    assert_eq!(
        at(now + SESSION_LIFETIME + Duration::from_secs(1)).unwrap_err(),
        Refusal::Unauthenticated,
        "a cookie older than its lifetime is refused, whatever the browser kept"
    );
}

#[test]
fn wrong_tokens_lock_the_peer_out_even_for_the_right_one() {
    let auth = with_token();
    let now = Instant::now();
    let from = |ip: &str, headers: &[(&str, &str)]| {
        let mut r = req(headers);
        r.peer = SocketAddr::new(ip.parse().unwrap(), 40000);
        r
    };
    let guesser = from("192.0.2.7", &[]);
    for _ in 0..throttle::FREE_FAILURES {
        assert_eq!(
            auth.login(&guesser, "a-wrong-guess", false, now),
            Err(Refusal::Unauthenticated)
        );
    }
    assert_eq!(
        auth.login(&guesser, TOKEN, false, now),
        Err(Refusal::Throttled(throttle::FIRST_LOCKOUT))
    );
    let bearer = format!("Bearer {TOKEN}");
    let scrape = from("192.0.2.7", &[("authorization", &bearer)]);
    assert!(matches!(
        auth.admit(&scrape, now),
        Err(Refusal::Throttled(_))
    ));
    // Another peer, and the guesser once the lockout is over, get in.
    assert!(auth
        .login(&from("192.0.2.8", &[]), TOKEN, false, now)
        .is_ok());
    let later = now + throttle::FIRST_LOCKOUT;
    assert!(auth.login(&guesser, TOKEN, false, later).is_ok());
}

#[test]
fn the_forwarded_client_is_the_peer_only_when_trusted() {
    let now = Instant::now();
    // Behind a proxy: every request comes from its address, and the
    // client is the last X-Forwarded-For entry (the one the proxy added).
    let via_proxy = |client: &str| {
        let mut r = req(&[("x-forwarded-for", client)]);
        r.peer = "10.0.0.1:40000".parse().unwrap();
        r
    };
    let trusting = Auth::new(Some(TOKEN.into()), "0.0.0.0:1".parse().unwrap(), true);
    for _ in 0..throttle::FREE_FAILURES {
        let _ = trusting.login(&via_proxy("1.2.3.4, 198.51.100.9"), "wrong", false, now);
    }
    let locked = trusting.login(&via_proxy("198.51.100.9"), TOKEN, false, now);
    assert!(matches!(locked, Err(Refusal::Throttled(_))), "{locked:?}");
    assert!(
        trusting
            .login(&via_proxy("198.51.100.9, 198.51.100.10"), TOKEN, false, now)
            .is_ok(),
        "another client behind the same proxy"
    );
    // Not trusted: a forged header does not dodge the count.
    let direct = with_token();
    for i in 0..throttle::FREE_FAILURES {
        let _ = direct.login(&via_proxy(&format!("203.0.113.{i}")), "wrong", false, now);
    }
    assert!(matches!(
        direct.login(&via_proxy("203.0.113.200"), TOKEN, false, now),
        Err(Refusal::Throttled(_))
    ));
    for (header, want) in [
        ("198.51.100.9", Some("198.51.100.9")),
        ("1.1.1.1,2001:db8::1", Some("2001:db8::1")),
        ("[2001:db8::2]:443", Some("2001:db8::2")),
        ("198.51.100.9:8080", Some("198.51.100.9")),
        ("unknown", None),
    ] {
        let got = forwarded_client(&req(&[("x-forwarded-for", header)]));
        assert_eq!(got, want.map(|w| w.parse().unwrap()), "{header}");
    }
}

#[test]
fn only_notices_this_process_sealed_are_opened() {
    let auth = Auth::new(None, "127.0.0.1:9464".parse().unwrap(), false);
    let sealed = auth.seal_notice("replayed:5:search.index", NOW);
    assert_eq!(
        auth.open_notice(&sealed, NOW),
        Some("replayed:5:search.index")
    );
    assert_eq!(
        auth.open_notice(&sealed, NOW.plus(NOTICE_LIFETIME + Duration::from_secs(1))),
        None
    );
    assert_eq!(
        auth.open_notice(
            &sealed,
            NOW.minus(seal::FUTURE_SKEW + Duration::from_secs(1))
        ),
        None,
        "issued in the future"
    );
    let other = Auth::new(None, "127.0.0.1:9464".parse().unwrap(), false);
    assert_eq!(other.open_notice(&sealed, NOW), None, "another key");
    let (head, mac) = sealed.rsplit_once('.').unwrap();
    let forged = format!("{}.{mac}", head.replace(":5:", ":500:"));
    assert_eq!(auth.open_notice(&forged, NOW), None);
    for junk in ["", "requeued+5", "1.2", "x.y.z"] {
        assert_eq!(auth.open_notice(junk, NOW), None, "{junk}");
    }
}

#[test]
fn a_post_needs_the_same_origin_and_the_csrf_token() {
    let auth = Auth::new(None, "127.0.0.1:9464".parse().unwrap(), false);
    let anyone = Access::Anyone;
    let good = Params(vec![(CSRF_FIELD.into(), auth.csrf(&anyone).into())]);
    let host = ("host", "127.0.0.1:9464");
    let origin = ("origin", "http://127.0.0.1:9464");
    let check =
        |headers: &[(&str, &str)], form: &Params| auth.check_post(&req(headers), form, &anyone);
    assert_eq!(check(&[host, origin], &good), Ok(()));
    let referer = ("referer", "http://127.0.0.1:9464/dead");
    assert_eq!(check(&[host, referer], &good), Ok(()));
    for headers in [
        vec![host],
        vec![host, ("origin", "http://evil.example")],
        vec![host, ("origin", "null")],
        vec![host, ("referer", "http://127.0.0.1:9464.evil/")],
    ] {
        assert!(check(&headers, &good).is_err(), "{headers:?}");
    }
    // Behind a TLS proxy that passes its own name.
    let proxied = [
        ("host", "127.0.0.1:9464"),
        ("x-forwarded-host", "console.example.com"),
        ("origin", "https://console.example.com"),
    ];
    assert_eq!(check(&proxied, &good), Ok(()));
    let stale = Params(vec![(CSRF_FIELD.into(), "0".repeat(64))]);
    assert!(check(&[host, origin], &stale).is_err());
    assert!(check(&[host, origin], &Params::default()).is_err());
    // A visitor (not logged in) has no token to give; a bearer needs none.
    let visitor = auth.check_post(&req(&[host, origin]), &Params::default(), &Access::Visitor);
    assert_eq!(visitor, Err(Refusal::Unauthenticated));
    let bearer = auth.check_post(&req(&[host, origin]), &Params::default(), &Access::Bearer);
    assert_eq!(bearer, Ok(()));
    let no_origin = auth.check_post(&req(&[host]), &Params::default(), &Access::Bearer);
    assert!(
        no_origin.is_err(),
        "the origin check holds for a bearer too"
    );
}
