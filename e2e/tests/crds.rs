//! CustomResourceDefinitions with the real kubectl against a real apiserver-lite process: a CRD
//! written here that uses what add-ons' CRDs use (a structural schema with defaults, enums,
//! patterns, a list-type map, int-or-string, preserve-unknown-fields, printer columns, short
//! names and categories, status and scale subresources, two served versions), its objects
//! through create, get, apply, patch, the status subresource, explain and validation errors,
//! and the CRD's deletion taking its objects along.

use std::io::{BufRead, BufReader};
use std::process::Stdio;
use std::time::Duration;

use podpath_e2e::{text, wait_for, ApiServer};

const CRD: &str = r#"apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: widgets.test.podpath.dev
spec:
  group: test.podpath.dev
  scope: Namespaced
  names:
    plural: widgets
    singular: widget
    kind: Widget
    shortNames: [wd]
    categories: [all-widgets]
  versions:
  - name: v1
    served: true
    storage: true
    subresources:
      status: {}
      scale:
        specReplicasPath: .spec.replicas
        statusReplicasPath: .status.replicas
    additionalPrinterColumns:
    - {name: Size, type: integer, jsonPath: .spec.size}
    - {name: Colour, type: string, jsonPath: .spec.colour}
    - {name: Ready, type: string, jsonPath: '.status.conditions[?(@.type=="Ready")].status'}
    - {name: Age, type: date, jsonPath: .metadata.creationTimestamp}
    schema:
      openAPIV3Schema:
        type: object
        description: A Widget of the tests.
        properties:
          spec:
            type: object
            required: [colour]
            x-kubernetes-validations:
            - rule: "self.size <= 5 || self.colour != 'red'"
              message: a red widget is at most 5 big
            - rule: "!has(self.code) || self.code != 'bad'"
              messageExpression: "'code ' + self.code + ' is refused'"
            properties:
              serial:
                type: string
                x-kubernetes-validations:
                - {rule: self == oldSelf, message: serial is immutable}
              size:
                type: integer
                minimum: 1
                maximum: 10
                default: 3
                description: How big the widget is.
              colour:
                type: string
                enum: [red, green, blue]
              replicas:
                type: integer
                default: 1
              code:
                type: string
                pattern: '^[a-z]{3}$'
              port:
                x-kubernetes-int-or-string: true
              extra:
                type: object
                x-kubernetes-preserve-unknown-fields: true
              parts:
                type: array
                x-kubernetes-list-type: map
                x-kubernetes-list-map-keys: [name]
                items:
                  type: object
                  required: [name]
                  properties:
                    name: {type: string}
                    count: {type: integer, default: 1}
          status:
            type: object
            properties:
              replicas: {type: integer}
              conditions:
                type: array
                items:
                  type: object
                  properties:
                    type: {type: string}
                    status: {type: string}
  - name: v1beta1
    served: true
    storage: false
    schema:
      openAPIV3Schema:
        type: object
        x-kubernetes-preserve-unknown-fields: true
"#;

const WIDGET: &str = "apiVersion: test.podpath.dev/v1
kind: Widget
metadata:
  name: small
spec:
  colour: red
  serial: s-1
  port: http
  extra: {anything: [1, 2]}
  parts:
  - name: axle
    count: 1
";

fn ok(srv: &ApiServer, args: &[&str]) -> String {
    srv.kubectl_ok(args)
}

fn fails(srv: &ApiServer, args: &[&str]) -> String {
    srv.kubectl_fails(args)
}

fn write(srv: &ApiServer, name: &str, content: &str) -> String {
    let p = srv.dir.path().join(name);
    std::fs::write(&p, content).unwrap();
    p.to_string_lossy().into_owned()
}

#[test]
fn a_crd_serves_its_resource_to_kubectl() {
    let srv = ApiServer::start(&[]).unwrap();
    let crd = write(&srv, "crd.yaml", CRD);
    assert_eq!(
        ok(&srv, &["apply", "-f", &crd]),
        "customresourcedefinition.apiextensions.k8s.io/widgets.test.podpath.dev created\n"
    );
    ok(&srv, &["wait", "--for", "condition=established", "crd/widgets.test.podpath.dev", "--timeout=10s"]);
    let status: serde_json::Value =
        serde_json::from_str(&ok(&srv, &["get", "crd", "widgets.test.podpath.dev", "-o", "json"])).unwrap();
    assert_eq!(status["status"]["acceptedNames"]["kind"], "Widget");
    assert_eq!(status["status"]["storedVersions"], serde_json::json!(["v1"]));
    let crds = ok(&srv, &["get", "crds"]);
    assert!(
        crds.starts_with("NAME") && crds.contains("CREATED AT") && crds.contains("widgets.test.podpath.dev"),
        "{crds}"
    );

    // Discovery: the resource, its short name and category, both versions.
    let resources = ok(&srv, &["api-resources", "--api-group=test.podpath.dev"]);
    let row: Vec<&str> = resources.lines().nth(1).unwrap().split_whitespace().collect();
    assert_eq!(row, ["widgets", "wd", "test.podpath.dev/v1", "true", "Widget"], "{resources}");
    let versions = ok(&srv, &["api-versions"]);
    assert!(
        versions.contains("test.podpath.dev/v1\n") && versions.contains("test.podpath.dev/v1beta1\n"),
        "{versions}"
    );

    // Create: defaults filled in, printer columns shown.
    let widget = write(&srv, "widget.yaml", WIDGET);
    assert_eq!(ok(&srv, &["apply", "-f", &widget]), "widget.test.podpath.dev/small created\n");
    let got: serde_json::Value = serde_json::from_str(&ok(&srv, &["get", "widget", "small", "-o", "json"])).unwrap();
    assert_eq!(got["spec"]["size"], 3);
    assert_eq!(got["spec"]["replicas"], 1);
    assert_eq!(got["spec"]["extra"], serde_json::json!({"anything": [1, 2]}));
    assert_eq!(got["metadata"]["generation"], 1);
    let table = ok(&srv, &["get", "wd"]);
    let header: Vec<&str> = table.lines().next().unwrap().split_whitespace().collect();
    assert_eq!(header, ["NAME", "SIZE", "COLOUR", "READY", "AGE"], "{table}");
    let row: Vec<&str> = table.lines().nth(1).unwrap().split_whitespace().collect();
    assert_eq!(&row[..3], ["small", "3", "red"], "{table}");
    assert!(ok(&srv, &["get", "all-widgets", "-o", "name"]).contains("widget.test.podpath.dev/small"));

    // The other served version: the same object in v1beta1.
    let beta: serde_json::Value =
        serde_json::from_str(&ok(&srv, &["get", "widgets.v1beta1.test.podpath.dev", "small", "-o", "json"])).unwrap();
    assert_eq!(beta["apiVersion"], "test.podpath.dev/v1beta1");
    assert_eq!(beta["spec"]["colour"], "red");

    // apply again with a change: a merge patch (custom kinds take no strategic merge patch).
    // (Defaults the manifest leaves out of a list item would make every re-apply "configured":
    // a merge patch replaces whole lists, as with a real server.)
    std::fs::write(&widget, WIDGET.replace("colour: red", "colour: blue")).unwrap();
    assert_eq!(ok(&srv, &["apply", "-f", &widget]), "widget.test.podpath.dev/small configured\n");
    assert_eq!(ok(&srv, &["apply", "-f", &widget]), "widget.test.podpath.dev/small unchanged\n");
    ok(&srv, &["patch", "widget", "small", "--type=merge", "-p", r#"{"spec":{"size":5}}"#]);
    let got: serde_json::Value = serde_json::from_str(&ok(&srv, &["get", "widget", "small", "-o", "json"])).unwrap();
    assert_eq!((got["spec"]["size"].as_i64(), got["spec"]["colour"].as_str()), (Some(5), Some("blue")));
    assert_eq!(got["metadata"]["generation"], 3);
    let err = fails(&srv, &["patch", "widget", "small", "--type=strategic", "-p", r#"{"spec":{"size":4}}"#]);
    assert!(err.contains("UnsupportedMediaType") || err.contains("415") || err.contains("unknown format"), "{err}");

    // The status subresource: only status changes through it, and never through the object.
    ok(
        &srv,
        &[
            "patch",
            "widget",
            "small",
            "--subresource=status",
            "--type=merge",
            "-p",
            r#"{"status":{"replicas":1,"conditions":[{"type":"Ready","status":"True"}]}}"#,
        ],
    );
    ok(&srv, &["patch", "widget", "small", "--type=merge", "-p", r#"{"status":{"replicas":7}}"#]);
    let table = ok(&srv, &["get", "widget", "small"]);
    let row: Vec<&str> = table.lines().nth(1).unwrap().split_whitespace().collect();
    assert_eq!(&row[..4], ["small", "5", "blue", "True"], "{table}");
    let got: serde_json::Value = serde_json::from_str(&ok(&srv, &["get", "widget", "small", "-o", "json"])).unwrap();
    assert_eq!(got["status"]["replicas"], 1);

    // The scale subresource, at the CRD's paths.
    assert_eq!(ok(&srv, &["scale", "widget", "small", "--replicas=3"]), "widget.test.podpath.dev/small scaled\n");
    let got: serde_json::Value = serde_json::from_str(&ok(&srv, &["get", "widget", "small", "-o", "json"])).unwrap();
    assert_eq!(got["spec"]["replicas"], 3);
    let scale: serde_json::Value =
        serde_json::from_str(&ok(&srv, &["get", "widget", "small", "--subresource=scale", "-o", "json"])).unwrap();
    assert_eq!(
        (scale["kind"].as_str(), scale["spec"]["replicas"].as_i64(), scale["status"]["replicas"].as_i64()),
        (Some("Scale"), Some(3), Some(1))
    );

    // Field selectors on metadata.
    let named = ok(&srv, &["get", "widgets", "--field-selector", "metadata.name=small", "-o", "name"]);
    assert_eq!(named, "widget.test.podpath.dev/small\n");
    let err = fails(&srv, &["get", "widgets", "--field-selector", "spec.colour=red"]);
    assert!(err.contains("field label not supported: spec.colour"), "{err}");

    // Validation, with the apiextensions server's texts.
    let bad = write(
        &srv,
        "bad.yaml",
        &WIDGET
            .replace("name: small", "name: big")
            .replace("colour: red", "colour: pink\n  size: 11\n  code: ABCD")
            .replace("port: http", "port: 1.5"),
    );
    let err = fails(&srv, &["apply", "-f", &bad]);
    for want in [
        r#"The Widget "big" is invalid:"#,
        r#"spec.code: Invalid value: "ABCD": spec.code in body should match '^[a-z]{3}$'"#,
        r#"spec.colour: Unsupported value: "pink": supported values: "red", "green", "blue""#,
        r#"spec.port: Invalid value: "number": spec.port in body must be of type integer,string: "number""#,
        "spec.size: Invalid value: 11: spec.size in body should be less than or equal to 10",
    ] {
        assert!(err.contains(want), "missing {want:?} in:\n{err}");
    }
    let dup = write(
        &srv,
        "dup.yaml",
        &WIDGET.replace("name: small", "name: dup").replace("  - name: axle\n", "  - name: axle\n  - name: axle\n"),
    );
    let err = fails(&srv, &["apply", "-f", &dup]);
    assert!(err.contains(r#"spec.parts[1]: Duplicate value: map[string]interface {}{"name":"axle"}"#), "{err}");
    let unknown = write(
        &srv,
        "unknown.yaml",
        &WIDGET.replace("name: small", "name: odd").replace("  port: http\n", "  port: http\n  shape: round\n"),
    );
    let err = fails(&srv, &["apply", "-f", &unknown]);
    assert!(err.contains(r#"unknown field "spec.shape""#), "{err}");
    let o = srv.kubectl(&["apply", "--validate=false", "-f", &unknown]);
    assert!(o.status.success(), "{:?}", text(&o));
    let odd: serde_json::Value = serde_json::from_str(&ok(&srv, &["get", "widget", "odd", "-o", "json"])).unwrap();
    assert!(odd["spec"].get("shape").is_none(), "pruned: {odd}");

    // CEL rules: the messages, a message expression, a transition rule.
    let red = write(
        &srv,
        "red.yaml",
        &WIDGET.replace("name: small", "name: red").replace("colour: red", "colour: red\n  size: 6"),
    );
    let err = fails(&srv, &["apply", "-f", &red]);
    assert!(err.contains("spec: Invalid value: a red widget is at most 5 big"), "{err}");
    let bad_code = write(
        &srv,
        "code.yaml",
        &WIDGET.replace("name: small", "name: coded").replace("colour: red", "colour: red\n  code: bad"),
    );
    let err = fails(&srv, &["apply", "-f", &bad_code]);
    assert!(err.contains("spec: Invalid value: code bad is refused"), "{err}");
    let err = fails(&srv, &["patch", "widget", "small", "--type=merge", "-p", r#"{"spec":{"serial":"s-2"}}"#]);
    assert!(err.contains(r#"spec.serial: Invalid value: "s-2": serial is immutable"#), "{err}");

    // explain reads the CRD's schema.
    let explain = ok(&srv, &["explain", "widget.spec.size"]);
    assert!(
        explain.contains("GROUP:      test.podpath.dev") && explain.contains("How big the widget is."),
        "{explain}"
    );

    // A watch sees changes.
    let mut watch = srv
        .kubectl_cmd(&["get", "widgets", "--watch-only", "-o", "name"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let out = watch.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    // The watch starts after its process does: label until the event shows.
    let mut seen = None;
    for i in 0..20 {
        ok(&srv, &["label", "--overwrite", "widget", "small", &format!("seen={i}")]);
        if let Ok(line) = rx.recv_timeout(Duration::from_millis(500)) {
            seen = Some(line);
            break;
        }
    }
    let _ = watch.kill();
    let _ = watch.wait();
    let seen = seen.expect("the watch saw no event");
    assert_eq!(seen, "widget.test.podpath.dev/small");

    // Deleting the CRD deletes its objects and stops serving the resource.
    ok(&srv, &["delete", "crd", "widgets.test.podpath.dev", "--timeout=20s"]);
    wait_for(Duration::from_secs(10), "the CRD to go", || {
        match srv.kubectl(&["get", "crd", "widgets.test.podpath.dev"]).status.success() {
            true => Err("still there".to_string()),
            false => Ok(()),
        }
    });
    let err = fails(&srv, &["get", "widgets"]);
    // (kubectl's discovery cache may still name the resource: then the list is a 404.)
    assert!(
        err.contains("the server doesn't have a resource type \"widgets\"")
            || err.contains("Unable to list \"test.podpath.dev/v1, Resource=widgets\": the server could not find the requested resource"),
        "{err}"
    );
    // Made again, it starts empty.
    ok(&srv, &["apply", "-f", &crd]);
    ok(&srv, &["wait", "--for", "condition=established", "crd/widgets.test.podpath.dev", "--timeout=10s"]);
    let again = ok(&srv, &["get", "widgets", "-o", "name"]);
    assert_eq!(again, "", "objects of the deleted CRD are gone");
}

#[test]
fn invalid_crds_are_refused_with_the_real_texts() {
    let srv = ApiServer::start(&[]).unwrap();
    let bad = CRD
        .replace("name: widgets.test.podpath.dev", "name: gadgets.test.podpath.dev")
        .replace("              size:\n                type: integer\n", "              size:\n")
        .replace("pattern: '^[a-z]{3}$'", "pattern: '(('");
    let file = write(&srv, "bad-crd.yaml", &bad);
    let err = fails(&srv, &["apply", "-f", &file]);
    for want in [
        r#"The CustomResourceDefinition "gadgets.test.podpath.dev" is invalid:"#,
        r#"metadata.name: Invalid value: "gadgets.test.podpath.dev": must be spec.names.plural+"."+spec.group"#,
        "spec.versions[0].schema.openAPIV3Schema.properties[spec].properties[size].type: Required value: must not be empty for specified object fields",
        r#"spec.versions[0].schema.openAPIV3Schema.properties[spec].properties[code].pattern: Invalid value: "((": must be a valid regular expression"#,
    ] {
        assert!(err.contains(want), "missing {want:?} in:\n{err}");
    }
    let bad_rule = write(&srv, "rule.yaml", &CRD.replace("self.size <= 5 || self.colour != 'red'", "self.size <= "));
    let err = fails(&srv, &["apply", "-f", &bad_rule]);
    assert!(
        err.contains(r#"spec.versions[0].schema.openAPIV3Schema.properties[spec].x-kubernetes-validations[0].rule: Invalid value: "self.size <= ": compilation failed"#),
        "{err}"
    );
    let two_storage = write(&srv, "two.yaml", &CRD.replace("    storage: false\n", "    storage: true\n"));
    let err = fails(&srv, &["apply", "-f", &two_storage]);
    assert!(err.contains("must have exactly one version marked as storage version"), "{err}");
    // Nothing was stored.
    assert_eq!(ok(&srv, &["get", "crds", "-o", "name"]), "");
}
