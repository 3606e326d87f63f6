use http::HeaderMap;

use super::*;

fn hash(key: &str) -> String {
    let digest = sha256(key.as_bytes());
    let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    format!("sha256:{hex}")
}

fn file() -> String {
    format!(
        r#"
[tenants.acme]
keys = ["{}"]
weight = 2
tokens_per_minute = 200000
max_priority = "high"

[tenants.beta]
keys = ["{}"]

[tenants.default]
"#,
        hash("sk-acme"),
        hash("sk-beta")
    )
}

fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
    let mut h = HeaderMap::new();
    for (name, value) in pairs {
        h.insert(*name, value.parse().unwrap());
    }
    h
}

#[test]
fn a_key_names_its_tenant_by_its_hash_and_priority_is_clamped() {
    let tenants = Tenants::parse(&file()).unwrap();
    let acme = tenants.identify(&headers(&[
        ("authorization", "Bearer sk-acme"),
        ("x-priority", "high"),
    ]));
    let acme = acme.unwrap();
    assert_eq!(acme.tenant.unwrap().name, "acme");
    assert_eq!(acme.tenant.unwrap().weight, 2);
    assert_eq!(acme.priority, Priority::High);
    let beta = tenants.identify(&headers(&[
        ("x-api-key", "sk-beta"),
        ("x-priority", "high"),
    ]));
    let beta = beta.unwrap();
    assert_eq!(beta.tenant.unwrap().name, "beta");
    assert_eq!(
        beta.priority,
        Priority::Normal,
        "clamped to beta's default cap"
    );
    let anonymous = tenants.identify(&HeaderMap::new()).unwrap();
    assert_eq!(anonymous.tenant.unwrap().name, "default");
    let unknown = tenants.identify(&headers(&[("authorization", "Bearer sk-nobody")]));
    assert_eq!(unknown.err(), Some(Refused::UnknownKey));
    let bad = tenants.identify(&headers(&[("x-priority", "urgent")]));
    assert_eq!(bad.err(), Some(Refused::BadPriority));
    assert_eq!(acme.tenant.unwrap().standing_slots, 0, "none by default");
    let standing = Tenants::parse(&format!("standing_slots = 2\n{}", file())).unwrap();
    assert!(standing.all().iter().all(|t| t.standing_slots == 2));
    assert!(acme.tenant.unwrap().engine_priority, "on by default");
    let off = Tenants::parse(&format!("engine_priority = false\n{}", file())).unwrap();
    assert!(off.all().iter().all(|t| !t.engine_priority));
    assert_eq!(standing.standing_slots(), 2);
}

#[test]
fn a_tenant_counts_as_active_for_the_files_active_after() {
    let default = Tenants::parse(&file()).unwrap();
    assert_eq!(default.active_after(), std::time::Duration::from_secs(5));
    let long = Tenants::parse(&format!("active_after = 30.5\n{}", file())).unwrap();
    assert_eq!(
        long.active_after(),
        std::time::Duration::from_millis(30_500)
    );
    let negative = Tenants::parse(&format!("active_after = -1.0\n{}", file()));
    let error = negative.err().map(|e| e.to_string()).unwrap_or_default();
    assert!(error.contains("active_after -1"), "{error}");
}

#[test]
fn without_a_default_tenant_a_request_without_a_key_is_refused() {
    let text = format!("[tenants.acme]\nkeys = [\"{}\"]\n", hash("sk-acme"));
    let tenants = Tenants::parse(&text).unwrap();
    assert_eq!(
        tenants.identify(&HeaderMap::new()).err(),
        Some(Refused::UnknownKey)
    );
}

#[test]
fn without_a_file_every_request_is_one_tenant() {
    let none = Tenants::default();
    let id = none.identify(&headers(&[
        ("authorization", "Bearer anything"),
        ("x-priority", "low"),
    ]));
    let id = id.unwrap();
    assert!(id.tenant.is_none());
    assert_eq!(id.priority, Priority::Low);
}

#[test]
fn a_file_with_a_plain_key_or_a_bad_hash_is_refused() {
    let bad_hex = hash("sk-acme").replace(|c: char| c.is_ascii_digit(), "g");
    for key in ["sk-acme", "sha256:abc", &bad_hex] {
        let text = format!("[tenants.acme]\nkeys = [\"{key}\"]\n");
        let error = Tenants::parse(&text).unwrap_err().to_string();
        assert!(
            error.contains("key 1 is not sha256:<64 hex digits>"),
            "{error}"
        );
        assert!(!error.contains(key), "the error repeats the entry: {error}");
    }
    assert!(Tenants::parse("[tenants.a]\nweight = 0\n").is_err());
    assert!(Tenants::parse("[tenants.a]\nmax_priority = \"urgent\"\n").is_err());
    assert!(Tenants::parse("[tenants.a]\nquota = 1\n").is_err());
}

#[test]
fn the_example_file_parses_and_names_its_tenants() {
    let tenants = Tenants::parse(include_str!("../../../../conf/tenants.example.toml")).unwrap();
    let names: Vec<&str> = tenants.all().iter().map(|t| t.name.as_str()).collect();
    assert_eq!(names, ["acme", "batch", "default"]);
    // The example's first key is the hash of "test".
    let id = tenants.identify(&headers(&[("x-api-key", "test"), ("x-priority", "high")]));
    assert_eq!(id.unwrap().priority, Priority::High);
}
