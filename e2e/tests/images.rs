//! Containers of images, end to end with the real kubectl: a lab whose docker.io mirror is a
//! real registry on loopback (Debian's docker-registry) holding a busybox built offline.
//! Root: builds a lab.

use std::time::Duration;

use podpath_e2e::{free_port, start_port_forward, text, wait_bounded, wait_for, Lab};
use testkit::registry::{busybox, nginx, Registry};

fn lab_with_registry(tag: &str, nodes: &str) -> (Registry, Lab) {
    let reg = Registry::start(None);
    reg.push("library/busybox:latest", &busybox(), None);
    let mirror = format!("--registry-mirror=docker.io=http://{}", reg.addr);
    let lab = Lab::up(tag, &["--nodes", nodes, &mirror]).expect("podpath up");
    (reg, lab)
}

fn kubectl_fails(lab: &Lab, args: &[&str]) -> String {
    let out =
        std::process::Command::new("kubectl").arg("--kubeconfig").arg(&lab.kubeconfig).args(args).output().unwrap();
    format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
}

#[test]
fn a_pod_of_an_image_runs_in_its_own_root_with_the_service_variables() {
    let (_reg, lab) = lab_with_registry("img", "1");
    lab.kubectl(&["create", "service", "clusterip", "my-nginx", "--tcp=80:80"]);
    // As the tutorial: the Service exists before the pod (kubelet writes the variables of the
    // Services it knows when the container starts).
    std::thread::sleep(Duration::from_millis(500));
    lab.kubectl(&["run", "bb", "--image=busybox", "--", "sleep", "3600"]);
    lab.kubectl(&["wait", "--for=condition=Ready", "pod/bb", "--timeout=60s"]);
    // The image's files, not the node's.
    let os = lab.kubectl(&["exec", "bb", "--", "cat", "/etc/os-release"]);
    assert!(os.contains("ID=podpath-busybox"), "{os}");
    assert_eq!(lab.kubectl(&["exec", "bb", "--", "hostname"]).trim(), "bb");
    assert_eq!(lab.kubectl(&["exec", "bb", "--", "cat", "/etc/hostname"]).trim(), "bb");
    assert!(lab.kubectl(&["exec", "bb", "--", "cat", "/etc/resolv.conf"]).contains("nameserver 10.96.0.10"));
    // Its own PID namespace: its process is 1.
    let ps = lab.kubectl(&["exec", "bb", "--", "ps"]);
    assert!(ps.lines().any(|l| l.split_whitespace().next() == Some("1") && l.contains("sleep 3600")), "{ps}");
    // Service variables, as kubelet writes them.
    let env = lab.kubectl(&["exec", "bb", "--", "env"]);
    for var in ["KUBERNETES_SERVICE_HOST=10.96.0.1", "KUBERNETES_PORT_443_TCP_PROTO=tcp", "MY_NGINX_SERVICE_PORT=80"] {
        assert!(env.contains(var), "{var} in {env}");
    }
    let ip = lab.kubectl(&["get", "svc", "my-nginx", "-o", "jsonpath={.spec.clusterIP}"]);
    assert!(env.contains(&format!("MY_NGINX_SERVICE_HOST={ip}\n")), "{env}");
    // `kubectl cp` writes into the container.
    let local = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(local.path(), "copied in\n").unwrap();
    lab.kubectl(&["cp", local.path().to_str().unwrap(), "bb:/tmp/in.txt"]);
    assert_eq!(lab.kubectl(&["exec", "bb", "--", "cat", "/tmp/in.txt"]), "copied in\n");
    assert!(
        !std::path::Path::new("/tmp/in.txt").exists()
            || std::fs::read_to_string("/tmp/in.txt").unwrap() != "copied in\n"
    );
    // The status and Events say what ran.
    let id = lab.kubectl(&["get", "pod", "bb", "-o", "jsonpath={.status.containerStatuses[0].containerID}"]);
    assert!(id.starts_with("crun://"), "{id}");
    let events = lab.kubectl(&[
        "get",
        "events",
        "--field-selector",
        "involvedObject.name=bb",
        "-o",
        "custom-columns=R:.reason,M:.message",
        "--no-headers",
    ]);
    assert!(events.contains("Pulling image \"busybox\""), "{events}");
    assert!(events.contains("Successfully pulled image \"busybox\""), "{events}");
    // An exec of a program the image lacks.
    let out = kubectl_fails(&lab, &["exec", "bb", "--", "nginx"]);
    assert!(out.contains("executable file not found"), "{out}");
}

#[test]
fn an_image_that_does_not_exist_waits_in_image_pull_back_off() {
    let (_reg, lab) = lab_with_registry("imgbad", "1");
    lab.kubectl(&["run", "nope", "--image=busybox:nope"]);
    let reason = |lab: &Lab| {
        lab.kubectl(&["get", "pod", "nope", "-o", "jsonpath={.status.containerStatuses[0].state.waiting.reason}"])
    };
    wait_for(Duration::from_secs(30), "ErrImagePull", || match reason(&lab).as_str() {
        "ErrImagePull" | "ImagePullBackOff" => Ok(()),
        other => Err(other.to_string()),
    });
    wait_for(Duration::from_secs(30), "ImagePullBackOff", || match reason(&lab).as_str() {
        "ImagePullBackOff" => Ok(()),
        other => Err(other.to_string()),
    });
    let msg =
        lab.kubectl(&["get", "pod", "nope", "-o", "jsonpath={.status.containerStatuses[0].state.waiting.message}"]);
    assert!(
        msg.contains("Back-off pulling image \"busybox:nope\"")
            && msg.contains("docker.io/library/busybox:nope: not found"),
        "{msg}"
    );
    let events = lab.kubectl(&[
        "get",
        "events",
        "--field-selector",
        "involvedObject.name=nope",
        "-o",
        "custom-columns=R:.reason,M:.message",
        "--no-headers",
    ]);
    assert!(events.contains("Failed to pull image \"busybox:nope\""), "{events}");
    assert!(events.contains("Error: ErrImagePull") && events.contains("Error: ImagePullBackOff"), "{events}");
    // Never: not pulled at all.
    lab.apply("apiVersion: v1\nkind: Pod\nmetadata: {name: never}\nspec:\n  containers:\n  - {name: c, image: 'busybox:1.0', imagePullPolicy: Never}\n");
    wait_for(Duration::from_secs(30), "ErrImageNeverPull", || {
        match lab
            .kubectl(&["get", "pod", "never", "-o", "jsonpath={.status.containerStatuses[0].state.waiting.reason}"])
            .as_str()
        {
            "ErrImageNeverPull" => Ok(()),
            other => Err(other.to_string()),
        }
    });
}

#[test]
fn a_deployment_of_an_image_answers_through_a_cluster_ip_and_the_load_balancer() {
    let (_reg, lab) = lab_with_registry("imgweb", "2");
    lab.wait_for_cluster_dns();
    lab.apply(
        "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: web}\nspec:\n  replicas: 2\n  selector: {matchLabels: {app: web}}\n  template:\n    metadata: {labels: {app: web}}\n    spec:\n      containers:\n      - name: httpd\n        image: busybox\n        command: [sh, -c, 'mkdir -p /www && echo served by $(hostname) > /www/index.html && exec httpd -f -p 80 -h /www']\n        ports: [{containerPort: 80}]\n",
    );
    lab.kubectl(&["rollout", "status", "deployment/web", "--timeout=90s"]);
    lab.kubectl(&["expose", "deployment", "web", "--port=80", "--type=LoadBalancer"]);
    let ip = lab.lb_ip("web");
    let page = wait_for(Duration::from_secs(30), "the page through the LB", || {
        let (code, out) = lab.curl(&[&format!("http://{ip}/")]);
        if code == 0 && out.starts_with("served by web-") {
            Ok(out)
        } else {
            Err(out)
        }
    });
    assert!(page.starts_with("served by web-"), "{page}");
    // From a pod: the Service's name resolves (busybox's own resolver: the test image's
    // static glibc busybox has no NSS for wget's lookups) and its ClusterIP answers.
    lab.kubectl(&["run", "client", "--image=busybox", "--", "sleep", "3600"]);
    lab.kubectl(&["wait", "--for=condition=Ready", "pod/client", "--timeout=60s"]);
    let cluster_ip = lab.kubectl(&["get", "svc", "web", "-o", "jsonpath={.spec.clusterIP}"]);
    let lookup = lab.kubectl(&["exec", "client", "--", "nslookup", "web.default.svc.cluster.local"]);
    assert!(lookup.contains(&cluster_ip), "{lookup}");
    let out = lab.kubectl(&["exec", "client", "--", "wget", "-qO-", &format!("http://{cluster_ip}/")]);
    assert!(out.starts_with("served by web-"), "{out}");
}

#[test]
fn secret_and_config_map_volumes_are_mounted_and_follow_updates_and_a_private_image_needs_its_pull_secret() {
    let public = Registry::start(None);
    public.push("library/busybox:latest", &busybox(), None);
    let auth_dir = tempfile::tempdir().unwrap();
    let private = Registry::start(Some(&testkit::registry::htpasswd(auth_dir.path(), "student", "s3cret")));
    private.push("private/bb:1", &busybox(), Some(("student", "s3cret")));
    let mirror = format!("--registry-mirror=docker.io=http://{}", public.addr);
    let plain = format!("--plain-http-registry={}", private.addr);
    let lab = Lab::up("imgvol", &["--nodes", "1", &mirror, &plain]).expect("podpath up");

    // "Connecting Applications with Services": the certificate from a Secret volume, the
    // configuration from a ConfigMap volume.
    lab.kubectl(&[
        "create",
        "secret",
        "generic",
        "nginxsecret",
        "--from-literal=tls.crt=CERT-1",
        "--from-literal=tls.key=KEY-1",
    ]);
    lab.kubectl(&["create", "configmap", "nginxconfigmap", "--from-literal=default.conf=listen 443;"]);
    lab.apply(
        "apiVersion: v1\nkind: Pod\nmetadata: {name: secure, labels: {app: secure}}\nspec:\n  volumes:\n  - {name: secret-volume, secret: {secretName: nginxsecret}}\n  - {name: configmap-volume, configMap: {name: nginxconfigmap}}\n  - {name: scratch, emptyDir: {}}\n  - {name: info, downwardAPI: {items: [{path: labels, fieldRef: {fieldPath: metadata.labels}}]}}\n  containers:\n  - name: c\n    image: busybox\n    command: [sleep, '3600']\n    volumeMounts:\n    - {name: secret-volume, mountPath: /etc/nginx/ssl, readOnly: true}\n    - {name: configmap-volume, mountPath: /etc/nginx/conf.d}\n    - {name: scratch, mountPath: /data}\n    - {name: scratch, mountPath: /sub, subPath: inner}\n    - {name: info, mountPath: /etc/podinfo}\n",
    );
    lab.kubectl(&["wait", "--for=condition=Ready", "pod/secure", "--timeout=60s"]);
    assert_eq!(lab.kubectl(&["exec", "secure", "--", "cat", "/etc/nginx/ssl/tls.crt"]), "CERT-1");
    assert_eq!(lab.kubectl(&["exec", "secure", "--", "cat", "/etc/nginx/conf.d/default.conf"]), "listen 443;");
    assert_eq!(lab.kubectl(&["exec", "secure", "--", "cat", "/etc/podinfo/labels"]), "app=\"secure\"");
    assert_eq!(lab.kubectl(&["exec", "secure", "--", "sh", "-c", "echo hi > /sub/f && cat /data/inner/f"]), "hi\n");
    let out = kubectl_fails(&lab, &["exec", "secure", "--", "touch", "/etc/nginx/ssl/x"]);
    assert!(out.contains("Read-only file system"), "{out}");
    // Updated in place, as kubelet does.
    lab.apply(
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: nginxconfigmap}\ndata: {default.conf: 'listen 8443;'}\n",
    );
    wait_for(Duration::from_secs(10), "the ConfigMap's new content in the volume", || {
        match lab.kubectl(&["exec", "secure", "--", "cat", "/etc/nginx/conf.d/default.conf"]).as_str() {
            "listen 8443;" => Ok(()),
            other => Err(other.to_string()),
        }
    });
    // A volume of a Secret that does not exist: FailedMount, the pod waits.
    lab.apply("apiVersion: v1\nkind: Pod\nmetadata: {name: nosecret}\nspec:\n  volumes: [{name: certs, secret: {secretName: missing}}]\n  containers:\n  - {name: c, image: busybox, command: [sleep, '3600'], volumeMounts: [{name: certs, mountPath: /certs}]}\n");
    wait_for(Duration::from_secs(30), "FailedMount", || {
        let ev = lab.kubectl(&[
            "get",
            "events",
            "--field-selector",
            "involvedObject.name=nosecret,reason=FailedMount",
            "-o",
            "custom-columns=M:.message",
            "--no-headers",
        ]);
        if ev.contains("MountVolume.SetUp failed for volume \"certs\" : secret \"missing\" not found") {
            Ok(())
        } else {
            Err(ev)
        }
    });

    // A private image: refused without its pull secret, pulled with it.
    let image = format!("{}/private/bb:1", private.addr);
    lab.kubectl(&["run", "nocred", &format!("--image={image}"), "--", "sleep", "3600"]);
    let msg = wait_for(Duration::from_secs(30), "the registry's refusal", || {
        let m = lab.kubectl(&[
            "get",
            "pod",
            "nocred",
            "-o",
            "jsonpath={.status.containerStatuses[0].state.waiting.message}",
        ]);
        if m.contains("pull access denied") || m.contains("401") {
            Ok(m)
        } else {
            Err(m)
        }
    });
    assert!(msg.contains(&image), "{msg}");
    lab.kubectl(&[
        "create",
        "secret",
        "docker-registry",
        "regcred",
        &format!("--docker-server={}", private.addr),
        "--docker-username=student",
        "--docker-password=s3cret",
    ]);
    lab.apply(&format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: withcred}}\nspec:\n  imagePullSecrets: [{{name: regcred}}]\n  containers:\n  - {{name: c, image: '{image}', command: [sleep, '3600']}}\n"
    ));
    lab.kubectl(&["wait", "--for=condition=Ready", "pod/withcred", "--timeout=60s"]);
    assert!(lab.kubectl(&["exec", "withcred", "--", "cat", "/etc/os-release"]).contains("podpath-busybox"));
}

/// "Connecting Applications with Services" (kubernetes.io), with manifests of the tutorial's
/// shape and `image: nginx` resolved through the mirror to an nginx built offline from
/// Debian's packages: nginx's own page through a ClusterIP, a NodePort and the LB; the Service
/// variables after the pods are recreated; then HTTPS with the certificate from a Secret volume
/// and the configuration from a ConfigMap volume.
#[test]
fn connecting_applications_with_services_runs_as_the_tutorial_has_it() {
    let reg = Registry::start(None);
    reg.push("library/busybox:latest", &busybox(), None);
    reg.push("library/nginx:latest", &testkit::registry::nginx(), None);
    let mirror = format!("--registry-mirror=docker.io=http://{}", reg.addr);
    let lab = Lab::up("imgtut", &["--nodes", "2", &mirror]).expect("podpath up");
    lab.wait_for_cluster_dns();
    lab.apply(
        "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: my-nginx}\nspec:\n  selector: {matchLabels: {run: my-nginx}}\n  replicas: 2\n  template:\n    metadata: {labels: {run: my-nginx}}\n    spec:\n      containers:\n      - name: my-nginx\n        image: nginx\n        ports: [{containerPort: 80}]\n",
    );
    lab.kubectl(&["rollout", "status", "deployment/my-nginx", "--timeout=90s"]);
    lab.kubectl(&["expose", "deployment/my-nginx"]);
    let ip = lab.kubectl(&["get", "svc", "my-nginx", "-o", "jsonpath={.spec.clusterIP}"]);
    // The image's own files and a whiteout of its top layer.
    let pod = lab.kubectl(&["get", "pods", "-l", "run=my-nginx", "-o", "jsonpath={.items[0].metadata.name}"]);
    assert!(lab.kubectl(&["exec", &pod, "--", "cat", "/etc/os-release"]).contains("ID=podpath-nginx"));
    let out = kubectl_fails(&lab, &["exec", &pod, "--", "cat", "/etc/motd"]);
    assert!(out.contains("No such file"), "the top layer's whiteout hides /etc/motd: {out}");
    // nginx's access log is the container's stdout.
    lab.kubectl(&["run", "curl", "--image=busybox", "--", "sleep", "3600"]);
    lab.kubectl(&["wait", "--for=condition=Ready", "pod/curl", "--timeout=60s"]);
    let page = lab.kubectl(&["exec", "curl", "--", "wget", "-qO-", "http://my-nginx/"]);
    assert!(page.contains("<title>Welcome to nginx!</title>"), "{page}");
    let page = lab.kubectl(&["exec", "curl", "--", "wget", "-qO-", &format!("http://{ip}/")]);
    assert!(page.contains("Welcome to nginx!"), "{page}");
    // The Service variables: pods made before the Service have none; recreated ones do.
    let env = lab.kubectl(&["exec", &pod, "--", "printenv"]);
    assert!(!env.contains("MY_NGINX_SERVICE_HOST"), "{env}");
    lab.kubectl(&["scale", "deployment", "my-nginx", "--replicas=0"]);
    lab.kubectl(&["wait", "--for=delete", "pod", "-l", "run=my-nginx", "--timeout=60s"]);
    lab.kubectl(&["scale", "deployment", "my-nginx", "--replicas=2"]);
    lab.kubectl(&["rollout", "status", "deployment/my-nginx", "--timeout=90s"]);
    let pod = lab.kubectl(&["get", "pods", "-l", "run=my-nginx", "-o", "jsonpath={.items[0].metadata.name}"]);
    let env = lab.kubectl(&["exec", &pod, "--", "printenv"]);
    assert!(
        env.contains(&format!("MY_NGINX_SERVICE_HOST={ip}\n")) && env.contains("MY_NGINX_SERVICE_PORT=80\n"),
        "{env}"
    );
    let logs = lab.kubectl(&["logs", &pod]);
    assert!(logs.is_empty() || !logs.contains("emerg"), "{logs}");
    // Through a NodePort and the LoadBalancer, from the client.
    lab.kubectl(&["patch", "svc", "my-nginx", "-p", "{\"spec\":{\"type\":\"LoadBalancer\"}}"]);
    let lb = lab.lb_ip("my-nginx");
    let np = lab.kubectl(&["get", "svc", "my-nginx", "-o", "jsonpath={.spec.ports[0].nodePort}"]);
    for url in [format!("http://{lb}/"), format!("http://192.168.56.12:{np}/")] {
        wait_for(Duration::from_secs(30), &format!("nginx's page at {url}"), || {
            let (code, out) = lab.curl(&[&url]);
            if code == 0 && out.contains("Welcome to nginx!") {
                Ok(())
            } else {
                Err(out)
            }
        });
    }
    let logs = lab.kubectl(&["logs", "-l", "run=my-nginx", "--tail=50"]);
    assert!(logs.contains("\"GET / HTTP/1.1\" 200"), "nginx's access log is the container's output: {logs}");

    // Securing the Service: a self-signed certificate in a Secret, the configuration in a
    // ConfigMap, both mounted as volumes.
    let dir = tempfile::tempdir().unwrap();
    let (key, crt) = (dir.path().join("nginx.key"), dir.path().join("nginx.crt"));
    let st = std::process::Command::new("openssl")
        .args(["req", "-x509", "-nodes", "-days", "365", "-newkey", "rsa:2048", "-subj", "/CN=my-nginx/O=my-nginx"])
        .arg("-keyout")
        .arg(&key)
        .arg("-out")
        .arg(&crt)
        .output()
        .expect("openssl");
    assert!(st.status.success(), "{}", String::from_utf8_lossy(&st.stderr));
    lab.kubectl(&[
        "create",
        "secret",
        "tls",
        "nginxsecret",
        &format!("--key={}", key.display()),
        &format!("--cert={}", crt.display()),
    ]);
    let conf = dir.path().join("default.conf");
    std::fs::write(&conf, "server {\n    listen 80 default_server;\n    listen 443 ssl;\n    root /usr/share/nginx/html;\n    index index.html;\n    server_name localhost;\n    ssl_certificate /etc/nginx/ssl/tls.crt;\n    ssl_certificate_key /etc/nginx/ssl/tls.key;\n    location / { try_files $uri $uri/ =404; }\n}\n").unwrap();
    lab.kubectl(&["create", "configmap", "nginxconfigmap", &format!("--from-file={}", conf.display())]);
    lab.apply(
        "apiVersion: v1\nkind: Service\nmetadata: {name: my-nginx-secure, labels: {run: my-nginx-secure}}\nspec:\n  type: NodePort\n  ports:\n  - {port: 8080, targetPort: 80, protocol: TCP, name: http}\n  - {port: 443, protocol: TCP, name: https}\n  selector: {run: my-nginx-secure}\n---\napiVersion: apps/v1\nkind: Deployment\nmetadata: {name: my-nginx-secure}\nspec:\n  selector: {matchLabels: {run: my-nginx-secure}}\n  replicas: 1\n  template:\n    metadata: {labels: {run: my-nginx-secure}}\n    spec:\n      volumes:\n      - {name: secret-volume, secret: {secretName: nginxsecret}}\n      - {name: configmap-volume, configMap: {name: nginxconfigmap}}\n      containers:\n      - name: nginxhttps\n        image: nginx\n        ports: [{containerPort: 443}, {containerPort: 80}]\n        volumeMounts:\n        - {mountPath: /etc/nginx/ssl, name: secret-volume}\n        - {mountPath: /etc/nginx/conf.d, name: configmap-volume}\n",
    );
    lab.kubectl(&["rollout", "status", "deployment/my-nginx-secure", "--timeout=90s"]);
    let https_np = lab.kubectl(&["get", "svc", "my-nginx-secure", "-o", "jsonpath={.spec.ports[1].nodePort}"]);
    wait_for(Duration::from_secs(30), "nginx's page over HTTPS through the NodePort", || {
        let (code, out) = lab.curl(&["-k", &format!("https://192.168.56.11:{https_np}/")]);
        if code == 0 && out.contains("Welcome to nginx!") {
            Ok(())
        } else {
            Err(out)
        }
    });
}

#[test]
fn port_forward_attach_restarts_and_a_shared_process_namespace_work_in_real_containers() {
    let reg = Registry::start(None);
    reg.push("library/busybox:latest", &busybox(), None);
    reg.push("library/nginx:latest", &nginx(), None);
    let mirror = format!("--registry-mirror=docker.io=http://{}", reg.addr);
    let lab = Lab::up("imgrun", &["--nodes", "1", &mirror]).expect("podpath up");
    lab.apply(
        "apiVersion: v1\nkind: Pod\nmetadata: {name: shared}\nspec:\n  shareProcessNamespace: true\n  containers:\n  - {name: nginx, image: nginx}\n  - {name: shell, image: busybox, command: [sleep, '3600']}\n",
    );
    lab.kubectl(&["run", "web", "--image=nginx", "--port=80"]);
    lab.kubectl(&["wait", "--for=condition=Ready", "pod/shared", "pod/web", "--timeout=90s"]);

    // shareProcessNamespace: PID 1 is the pod's pause, and one container sees the other's.
    let ps = lab.kubectl(&["exec", "shared", "-c", "shell", "--", "ps", "ax"]);
    assert!(
        ps.lines().any(|l| l.split_whitespace().next() == Some("1") && l.contains("podpath-workload pause")),
        "{ps}"
    );
    assert!(ps.contains("nginx: master process") && ps.contains("sleep 3600"), "{ps}");
    // Without it, a container's own process is 1 and it sees no other container's.
    let own = lab.kubectl(&["exec", "web", "--", "cat", "/proc/1/cmdline"]);
    assert!(own.starts_with("nginx: master process"), "{own:?}");

    // port-forward reaches nginx in its container.
    let page = |port: u16| {
        let o = std::process::Command::new("curl")
            .args(["-sS", "--max-time", "5"])
            .arg(format!("http://127.0.0.1:{port}/"))
            .output()
            .unwrap();
        text(&o).0
    };
    let forward = |port: u16| {
        let mut c = std::process::Command::new("kubectl");
        c.arg("--kubeconfig").arg(&lab.kubeconfig).args(["port-forward", "--address", "127.0.0.1", "pod/web"]);
        c.arg(format!("{port}:80"));
        start_port_forward(c, 1)
    };
    let port = free_port();
    let mut pf = forward(port);
    assert!(page(port).contains("Welcome to nginx!"), "{}", page(port));
    let _ = pf.kill();
    let _ = pf.wait();

    // A killed container restarts with its port free again (nothing of it outlives it).
    let (ok, out) = lab.run("fault", &["kill", "pod", "default/web"]);
    assert!(ok, "{out}");
    wait_for(Duration::from_secs(60), "web restarted and ready", || {
        let s = lab.kubectl(&[
            "get",
            "pod",
            "web",
            "-o",
            "jsonpath={.status.containerStatuses[0].restartCount} {.status.containerStatuses[0].ready}",
        ]);
        if s == "1 true" {
            Ok(())
        } else {
            Err(s)
        }
    });
    let last = lab.kubectl(&[
        "get",
        "pod",
        "web",
        "-o",
        "jsonpath={.status.containerStatuses[0].lastState.terminated.exitCode} {.status.containerStatuses[0].lastState.terminated.containerID}",
    ]);
    assert!(last.starts_with("137 crun://"), "{last}");
    let port = free_port();
    let mut pf = forward(port);
    assert!(page(port).contains("Welcome to nginx!"), "after the restart: {}", page(port));
    let _ = pf.kill();
    let _ = pf.wait();

    // `kubectl run -i --rm`: stdin reaches the container's process, its output comes back, and
    // the pod is deleted after.
    let mut child = std::process::Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(&lab.kubeconfig)
        .args(["run", "asker", "--image=busybox", "-i", "--rm", "--restart=Never", "--command", "--"])
        .args(["sh", "-c", "read x; echo \"got $x from $(hostname)\""])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    {
        use std::io::Write;
        let mut stdin = child.stdin.take().unwrap();
        std::thread::sleep(Duration::from_secs(2));
        writeln!(stdin, "hello").unwrap();
    }
    let o = wait_bounded(child, Duration::from_secs(60));
    let (out, err) = text(&o);
    assert!(o.status.success() && out.contains("got hello from asker"), "run -i --rm: {out} {err}");
    wait_for(Duration::from_secs(30), "the pod of run --rm deleted", || {
        let out = kubectl_fails(&lab, &["get", "pod", "asker"]);
        if out.contains("NotFound") || out.contains("not found") {
            Ok(())
        } else {
            Err(out)
        }
    });
}

#[test]
fn jobs_run_to_completion_fail_past_their_backoff_limit_indexed_jobs_cover_every_index_and_cronjobs_run_on_schedule() {
    let (_reg, lab) = lab_with_registry("imgjob", "2");
    lab.kubectl(&["create", "job", "pi", "--image=busybox", "--", "sh", "-c", "echo pi is 3.14"]);
    lab.kubectl(&["wait", "--for=condition=complete", "job/pi", "--timeout=90s"]);
    assert_eq!(lab.kubectl(&["logs", "job/pi"]), "pi is 3.14\n");
    let row = lab.kubectl(&["get", "job", "pi", "--no-headers"]);
    let cells: Vec<&str> = row.split_whitespace().collect();
    assert_eq!((cells[1], cells[2]), ("Complete", "1/1"), "{row}");
    let pod_phase = lab.kubectl(&["get", "pods", "-l", "job-name=pi", "-o", "jsonpath={.items[*].status.phase}"]);
    assert_eq!(pod_phase, "Succeeded");

    // Always failing, no retries: Failed with the controller's reason and Event.
    lab.apply(
        "apiVersion: batch/v1\nkind: Job\nmetadata: {name: broken}\nspec:\n  backoffLimit: 0\n  template:\n    spec:\n      restartPolicy: Never\n      containers: [{name: c, image: busybox, command: [sh, -c, 'exit 3']}]\n",
    );
    lab.kubectl(&["wait", "--for=condition=failed", "job/broken", "--timeout=90s"]);
    let reason =
        lab.kubectl(&["get", "job", "broken", "-o", "jsonpath={.status.conditions[?(@.type==\"Failed\")].reason}"]);
    assert_eq!(reason, "BackoffLimitExceeded");
    let events = lab.kubectl(&[
        "get",
        "events",
        "--field-selector",
        "involvedObject.name=broken",
        "-o",
        "custom-columns=R:.reason,M:.message",
        "--no-headers",
    ]);
    assert!(events.contains("Job has reached the specified backoff limit"), "{events}");

    // A pod failure policy (the documentation's example, its image swapped): exit code 42 of
    // the main container fails the Job at once, without using up the back-off limit.
    lab.apply(
        "apiVersion: batch/v1\nkind: Job\nmetadata: {name: policy}\nspec:\n  completions: 2\n  parallelism: 2\n  backoffLimit: 6\n  podFailurePolicy:\n    rules:\n    - action: FailJob\n      onExitCodes: {containerName: main, operator: In, values: [42]}\n    - action: Ignore\n      onPodConditions: [{type: DisruptionTarget}]\n  template:\n    spec:\n      restartPolicy: Never\n      containers: [{name: main, image: busybox, command: [sh, -c, 'exit 42']}]\n",
    );
    lab.kubectl(&["wait", "--for=condition=failed", "job/policy", "--timeout=90s"]);
    let failed = lab.kubectl(&[
        "get",
        "job",
        "policy",
        "-o",
        "jsonpath={.status.conditions[?(@.type==\"Failed\")].reason}: {.status.conditions[?(@.type==\"Failed\")].message}",
    ]);
    assert!(failed.starts_with("PodFailurePolicy: Container main for pod default/policy-"), "{failed}");
    assert!(failed.ends_with("failed with exit code 42 matching FailJob rule at index 0"), "{failed}");

    // Indexed: one pod per index, each told its index.
    lab.apply(
        "apiVersion: batch/v1\nkind: Job\nmetadata: {name: shards}\nspec:\n  completions: 3\n  parallelism: 3\n  completionMode: Indexed\n  template:\n    spec:\n      restartPolicy: Never\n      containers: [{name: c, image: busybox, command: [sh, -c, 'echo shard $JOB_COMPLETION_INDEX of $(hostname)']}]\n",
    );
    lab.kubectl(&["wait", "--for=condition=complete", "job/shards", "--timeout=90s"]);
    assert_eq!(lab.kubectl(&["get", "job", "shards", "-o", "jsonpath={.status.completedIndexes}"]), "0-2");
    let pods = lab.kubectl(&["get", "pods", "-l", "job-name=shards", "-o", "name"]);
    let mut said: Vec<String> = pods.lines().map(|p| lab.kubectl(&["logs", p]).trim().to_string()).collect::<Vec<_>>();
    said.sort();
    assert_eq!(said, ["shard 0 of shards-0", "shard 1 of shards-1", "shard 2 of shards-2"]);

    // A CronJob runs its Jobs on schedule; `create job --from=cronjob/` runs one by hand.
    lab.kubectl(&["create", "cronjob", "tick", "--image=busybox", "--schedule=@every 2s", "--", "echo", "tick"]);
    let first = wait_for(Duration::from_secs(60), "the CronJob's first Job complete", || {
        let jobs = lab.kubectl(&[
            "get",
            "jobs",
            "-o",
            "jsonpath={range .items[?(@.metadata.ownerReferences[0].kind==\"CronJob\")]}{.metadata.name} {.status.succeeded}{\"\\n\"}{end}",
        ]);
        match jobs.lines().find(|l| l.ends_with(" 1")) {
            Some(l) => Ok(l.split_whitespace().next().unwrap_or("").to_string()),
            None => Err(jobs),
        }
    });
    assert!(first.starts_with("tick-"), "{first}");
    assert_eq!(lab.kubectl(&["logs", &format!("job/{first}")]), "tick\n");
    let last = lab.kubectl(&["get", "cronjob", "tick", "-o", "jsonpath={.status.lastScheduleTime}"]);
    assert!(!last.is_empty());
    let events = lab.kubectl(&[
        "get",
        "events",
        "--field-selector",
        "involvedObject.name=tick",
        "-o",
        "custom-columns=R:.reason,M:.message",
        "--no-headers",
    ]);
    assert!(events.contains(&format!("Created job {first}")), "{events}");
    lab.kubectl(&["create", "job", "by-hand", "--from=cronjob/tick"]);
    lab.kubectl(&["wait", "--for=condition=complete", "job/by-hand", "--timeout=60s"]);
    // A schedule that never fires (February 30th): no Job, nothing active.
    lab.kubectl(&["create", "cronjob", "never", "--image=busybox", "--schedule=0 0 30 2 *", "--", "true"]);
    std::thread::sleep(Duration::from_secs(2));
    let row = lab.kubectl(&["get", "cronjob", "never", "--no-headers"]);
    let cells: Vec<&str> = row.split_whitespace().collect();
    assert_eq!(cells[cells.len() - 3..cells.len() - 1], ["0", "<none>"], "{row}");
    // Its Jobs go with it (the one made by hand too: kubectl makes the CronJob its owner).
    lab.kubectl(&["delete", "cronjob", "tick", "never"]);

    // Deleting a Job takes its pods.
    lab.kubectl(&["delete", "job", "pi", "shards", "broken", "policy"]);
    wait_for(Duration::from_secs(30), "the Jobs' pods gone", || {
        let left = lab.kubectl(&["get", "pods", "-l", "job-name", "-o", "name"]);
        if left.trim().is_empty() {
            Ok(())
        } else {
            Err(left)
        }
    });
}

#[test]
fn a_daemonset_runs_one_pod_per_node_and_rolls_a_new_template_node_by_node() {
    let (_reg, lab) = lab_with_registry("imgds", "2");
    // `sleep` as a container's PID 1 ignores SIGTERM: a short grace period keeps the rollout quick.
    let ds = |message: &str| {
        format!(
            "apiVersion: apps/v1\nkind: DaemonSet\nmetadata: {{name: agent}}\nspec:\n  selector: {{matchLabels: {{app: agent}}}}\n  template:\n    metadata: {{labels: {{app: agent}}}}\n    spec:\n      terminationGracePeriodSeconds: 1\n      containers: [{{name: c, image: busybox, command: [sh, -c, 'echo {message} on $(hostname); exec sleep 3600']}}]\n"
        )
    };
    lab.apply(&ds("v1"));
    lab.kubectl(&["rollout", "status", "ds/agent", "--timeout=90s"]);
    let placed = |want: &str| {
        let out = lab.kubectl(&[
            "get",
            "pods",
            "-l",
            "app=agent",
            "-o",
            "jsonpath={range .items[*]}{.spec.nodeName} {.metadata.name}{\"\\n\"}{end}",
        ]);
        let mut nodes: Vec<String> =
            out.lines().filter_map(|l| l.split_whitespace().next().map(String::from)).collect();
        nodes.sort();
        assert_eq!(nodes, ["node-1", "node-2"], "{want}: {out}");
        out
    };
    placed("v1");
    let row = lab.kubectl(&["get", "ds", "agent", "--no-headers"]);
    let cells: Vec<&str> = row.split_whitespace().collect();
    assert_eq!(cells[1..6], ["2", "2", "2", "2", "2"], "{row}");
    // A node that joins gets its pod (and leaves: its pod goes with it).
    let (ok, out) = lab.run("node", &["add"]);
    assert!(ok && out.contains("node-3: joined"), "{out}");
    let zone =
        lab.kubectl(&["get", "node", "node-3", "-o", "jsonpath={.metadata.labels.topology\\.kubernetes\\.io/zone}"]);
    assert_eq!(zone, "zone-c");
    lab.kubectl(&["rollout", "status", "ds/agent", "--timeout=90s"]);
    let on3 =
        lab.kubectl(&["get", "pods", "-l", "app=agent", "--field-selector", "spec.nodeName=node-3", "-o", "name"]);
    assert_eq!(on3.lines().count(), 1, "{on3}");
    let pod3 = on3.trim().trim_start_matches("pod/").to_string();
    wait_for(Duration::from_secs(30), "node-3's daemon pod logs", || {
        let log = kubectl_fails(&lab, &["logs", &pod3]);
        if log.starts_with("v1 on agent-") {
            Ok(())
        } else {
            Err(log)
        }
    });
    // Taken out of the cluster as an administrator does with a dead machine: powered off,
    // then its Node deleted.
    let (ok, out) = lab.run("node", &["stop", "node-3"]);
    assert!(ok, "{out}");
    lab.kubectl(&["delete", "node", "node-3"]);
    wait_for(Duration::from_secs(60), "node-3's daemon pod gone with its node", || {
        let left = lab.kubectl(&["get", "pods", "-l", "app=agent", "-o", "name"]);
        if left.lines().count() == 2 {
            Ok(())
        } else {
            Err(left)
        }
    });
    // A new template rolls out, one node at a time, to both nodes again.
    lab.apply(&ds("v2"));
    lab.kubectl(&["rollout", "status", "ds/agent", "--timeout=120s"]);
    let pods = placed("v2");
    for line in pods.lines() {
        let name = line.split_whitespace().nth(1).unwrap();
        let log = lab.kubectl(&["logs", name]);
        assert!(log.starts_with("v2 on agent-"), "{name}: {log}");
    }
    // Each template is a ControllerRevision: `rollout history` lists both, `rollout undo` puts
    // v1 back (rolled out again, its revision renumbered 3).
    let history = lab.kubectl(&["rollout", "history", "ds/agent"]);
    let revisions: Vec<&str> = history.lines().skip(2).filter_map(|l| l.split_whitespace().next()).collect();
    assert_eq!(revisions, ["1", "2"], "{history}");
    let shown = lab.kubectl(&["rollout", "history", "ds/agent", "--revision=1"]);
    assert!(shown.contains("echo v1 on"), "{shown}");
    lab.kubectl(&["rollout", "undo", "ds/agent"]);
    lab.kubectl(&["rollout", "status", "ds/agent", "--timeout=120s"]);
    wait_for(Duration::from_secs(60), "v1 back on both nodes", || {
        let pods = lab.kubectl(&["get", "pods", "-l", "app=agent", "-o", "name"]);
        let logs: Vec<String> = pods.lines().map(|p| kubectl_fails(&lab, &["logs", p])).collect();
        if logs.len() == 2 && logs.iter().all(|l| l.starts_with("v1 on agent-")) {
            Ok(())
        } else {
            Err(format!("{logs:?}"))
        }
    });
    let history = lab.kubectl(&["rollout", "history", "ds/agent"]);
    let revisions: Vec<&str> = history.lines().skip(2).filter_map(|l| l.split_whitespace().next()).collect();
    assert_eq!(revisions, ["2", "3"], "{history}");
    let events = lab.kubectl(&[
        "get",
        "events",
        "--field-selector",
        "involvedObject.name=agent",
        "-o",
        "custom-columns=R:.reason",
        "--no-headers",
    ]);
    assert!(events.contains("SuccessfulCreate") && events.contains("SuccessfulDelete"), "{events}");
    // Deleted, its pods go too.
    lab.kubectl(&["delete", "ds", "agent"]);
    wait_for(Duration::from_secs(60), "the DaemonSet's pods gone", || {
        let left = lab.kubectl(&["get", "pods", "-l", "app=agent", "-o", "name"]);
        if left.trim().is_empty() {
            Ok(())
        } else {
            Err(left)
        }
    });
}

#[test]
fn statefulset_basics_as_written_ordered_pods_stable_dns_and_storage_that_stays() {
    let (_reg, lab) = lab_with_registry("imgsts", "2");
    lab.wait_for_cluster_dns();
    // "StatefulSet Basics"' web.yaml, its image swapped for busybox's httpd serving the same
    // directory (the claim template, mount and Service are the tutorial's).
    lab.apply(
        "apiVersion: v1\nkind: Service\nmetadata: {name: nginx, labels: {app: nginx}}\nspec:\n  ports: [{port: 80, name: web}]\n  clusterIP: None\n  selector: {app: nginx}\n---\napiVersion: apps/v1\nkind: StatefulSet\nmetadata: {name: web}\nspec:\n  serviceName: nginx\n  replicas: 2\n  selector: {matchLabels: {app: nginx}}\n  template:\n    metadata: {labels: {app: nginx}}\n    spec:\n      terminationGracePeriodSeconds: 1\n      containers:\n      - name: nginx\n        image: busybox\n        command: [sh, -c, 'exec httpd -f -p 80 -h /usr/share/nginx/html']\n        ports: [{containerPort: 80, name: web}]\n        volumeMounts: [{name: www, mountPath: /usr/share/nginx/html}]\n  volumeClaimTemplates:\n  - metadata: {name: www}\n    spec:\n      accessModes: [ReadWriteOnce]\n      resources: {requests: {storage: 1Gi}}\n",
    );
    lab.kubectl(&["rollout", "status", "sts/web", "--timeout=90s"]);
    // In order: web-0 was Ready before web-1 was created.
    let created = |pod: &str| lab.kubectl(&["get", "pod", pod, "-o", "jsonpath={.metadata.creationTimestamp}"]);
    let ready0 = lab.kubectl(&[
        "get",
        "pod",
        "web-0",
        "-o",
        "jsonpath={.status.conditions[?(@.type==\"Ready\")].lastTransitionTime}",
    ]);
    assert!(ready0 <= created("web-1"), "web-0 ready at {ready0}, web-1 created at {}", created("web-1"));
    let history = lab.kubectl(&["rollout", "history", "sts/web"]);
    assert_eq!(
        history.lines().skip(2).filter_map(|l| l.split_whitespace().next()).collect::<Vec<_>>(),
        ["1"],
        "{history}"
    );
    // Each pod's claim, bound to a volume the lab's provisioner made on the pod's node.
    let claims = lab.kubectl(&["get", "pvc", "-l", "app=nginx", "--no-headers"]);
    let rows: Vec<Vec<&str>> = claims.lines().map(|l| l.split_whitespace().collect()).collect();
    assert_eq!(rows.len(), 2, "{claims}");
    for (i, row) in rows.iter().enumerate() {
        assert_eq!(
            (row[0], row[1], row[3], row[4], row[5]),
            (format!("www-web-{i}").as_str(), "Bound", "1Gi", "RWO", "standard"),
            "{claims}"
        );
        let pod_node = lab.kubectl(&["get", "pod", &format!("web-{i}"), "-o", "jsonpath={.spec.nodeName}"]);
        let pv_node = lab.kubectl(&[
            "get",
            "pv",
            row[2],
            "-o",
            "jsonpath={.spec.nodeAffinity.required.nodeSelectorTerms[0].matchExpressions[0].values[0]}",
        ]);
        assert_eq!(pod_node, pv_node, "web-{i}'s volume is on its node");
    }
    let classes = lab.kubectl(&["get", "sc", "--no-headers"]);
    let class: Vec<&str> = classes.split_whitespace().collect();
    assert_eq!(
        class[..6],
        ["standard", "(default)", "podpath.dev/local-path", "Delete", "WaitForFirstConsumer", "false"]
    );
    let described = lab.kubectl(&["describe", "pvc", "www-web-0"]);
    for want in ["Status:        Bound", "StorageClass:  standard", "Used By:       web-0", "ProvisioningSucceeded"] {
        assert!(described.contains(want), "{want} in {described}");
    }
    for i in 0..2 {
        assert_eq!(lab.kubectl(&["exec", &format!("web-{i}"), "--", "hostname"]).trim(), format!("web-{i}"));
        // As the tutorial: each pod writes its hostname into its volume's index.html.
        lab.kubectl(&[
            "exec",
            &format!("web-{i}"),
            "--",
            "sh",
            "-c",
            "echo \"$(hostname)\" > /usr/share/nginx/html/index.html",
        ]);
    }
    // Each pod has its DNS name under the headless Service, and serves its own page.
    lab.kubectl(&["run", "client", "--image=busybox", "--", "sleep", "3600"]);
    lab.kubectl(&["wait", "--for=condition=Ready", "pod/client", "--timeout=60s"]);
    let ip0 = lab.kubectl(&["get", "pod", "web-0", "-o", "jsonpath={.status.podIP}"]);
    let lookup = lab.kubectl(&["exec", "client", "--", "nslookup", "web-0.nginx.default.svc.cluster.local"]);
    assert!(lookup.contains(&ip0), "{lookup}");
    let pages = || {
        (0..2)
            .map(|i| {
                lab.kubectl(&["exec", "client", "--", "wget", "-qO-", &format!("http://web-{i}.nginx")])
                    .trim()
                    .to_string()
            })
            .collect::<Vec<_>>()
    };
    assert_eq!(pages(), ["web-0", "web-1"]);
    // Deleted, the pods come back under the same names, DNS names and volumes.
    let uid = lab.kubectl(&["get", "pod", "web-0", "-o", "jsonpath={.metadata.uid}"]);
    lab.kubectl(&["delete", "pod", "-l", "app=nginx"]);
    wait_for(Duration::from_secs(90), "web-0 and web-1 recreated and ready", || {
        let s = lab.kubectl(&[
            "get",
            "pods",
            "-l",
            "app=nginx",
            "-o",
            "jsonpath={range .items[*]}{.metadata.name}={.metadata.uid}={.status.conditions[?(@.type==\"Ready\")].status} {end}",
        ]);
        let fresh = s.split_whitespace().filter(|p| p.ends_with("=True") && !p.contains(&uid)).count();
        if fresh == 2 {
            Ok(())
        } else {
            Err(s)
        }
    });
    wait_for(Duration::from_secs(30), "the pages served again from the kept volumes", || {
        let p = pages();
        if p == ["web-0", "web-1"] {
            Ok(())
        } else {
            Err(format!("{p:?}"))
        }
    });
    // Scale to 5 and back to 3: in order up, web-4 before web-3 down; the claims stay (Retain).
    lab.kubectl(&["scale", "sts", "web", "--replicas=5"]);
    lab.kubectl(&["rollout", "status", "sts/web", "--timeout=120s"]);
    let pods = lab.kubectl(&["get", "pods", "-l", "app=nginx", "-o", "name"]);
    assert_eq!(pods.lines().count(), 5, "{pods}");
    lab.kubectl(&["scale", "sts", "web", "--replicas=3"]);
    wait_for(Duration::from_secs(60), "scaled back to web-0 … web-2", || {
        let pods = lab.kubectl(&["get", "pods", "-l", "app=nginx", "-o", "name"]);
        if pods.trim() == "pod/web-0\npod/web-1\npod/web-2" {
            Ok(())
        } else {
            Err(pods)
        }
    });
    let claims = lab.kubectl(&["get", "pvc", "-l", "app=nginx", "-o", "name"]);
    assert_eq!(claims.lines().count(), 5, "the claims of web-3 and web-4 stay: {claims}");
    let controller_messages = || {
        lab.kubectl(&[
            "get",
            "events",
            "--field-selector",
            "involvedObject.name=web",
            "--sort-by=.lastTimestamp",
            "-o",
            "custom-columns=M:.message",
            "--no-headers",
        ])
    };
    let events = controller_messages();
    assert!(events.contains("create Claim www-web-0 Pod web-0 in StatefulSet web success"), "{events}");
    let deletes: Vec<&str> = events.lines().filter(|l| l.starts_with("delete Pod")).collect();
    assert_eq!(
        deletes[deletes.len() - 2..],
        ["delete Pod web-4 in StatefulSet web successful", "delete Pod web-3 in StatefulSet web successful"],
        "{events}"
    );
    let revision_of =
        |pod: &str| lab.kubectl(&["get", "pod", pod, "-o", "jsonpath={.metadata.labels.controller-revision-hash}"]);
    // The same, while pods come and go (a pod being made again is briefly not there): None then.
    let revision_now = |pod: &str| {
        let o = std::process::Command::new("kubectl")
            .arg("--kubeconfig")
            .arg(&lab.kubeconfig)
            .args(["get", "pod", pod, "-o", "jsonpath={.metadata.labels.controller-revision-hash}"])
            .output()
            .unwrap();
        o.status.success().then(|| String::from_utf8_lossy(&o.stdout).into_owned())
    };
    // "Updating StatefulSets": a new image rolls from web-2 down to web-0.
    let first = revision_of("web-0");
    lab.kubectl(&[
        "patch",
        "statefulset",
        "web",
        "--type=json",
        "-p",
        r#"[{"op": "replace", "path": "/spec/template/spec/containers/0/image", "value": "busybox:latest"}]"#,
    ]);
    lab.kubectl(&["rollout", "status", "sts/web", "--timeout=120s"]);
    let second = revision_of("web-0");
    assert_ne!(first, second);
    for i in 0..3 {
        assert_eq!(revision_of(&format!("web-{i}")), second);
    }
    let rolled: Vec<String> =
        controller_messages().lines().filter(|l| l.starts_with("delete Pod")).map(String::from).collect();
    assert_eq!(
        rolled[rolled.len() - 3..],
        [
            "delete Pod web-2 in StatefulSet web successful",
            "delete Pod web-1 in StatefulSet web successful",
            "delete Pod web-0 in StatefulSet web successful"
        ],
        "reverse ordinal order"
    );
    // Staging an update with a partition: only web-2 takes it; web-1, deleted, comes back as
    // it was; lowering the partition to 0 rolls the rest.
    lab.kubectl(&[
        "patch",
        "statefulset",
        "web",
        "-p",
        r#"{"spec":{"updateStrategy":{"type":"RollingUpdate","rollingUpdate":{"partition":2}}}}"#,
    ]);
    lab.kubectl(&[
        "patch",
        "statefulset",
        "web",
        "--type=json",
        "-p",
        r#"[{"op": "replace", "path": "/spec/template/spec/containers/0/image", "value": "docker.io/library/busybox:latest"}]"#,
    ]);
    let third = wait_for(Duration::from_secs(60), "web-2 on the staged revision", || match revision_now("web-2") {
        Some(r) if r != second && !r.is_empty() => Ok(r),
        other => Err(format!("{other:?}")),
    });
    lab.kubectl(&["delete", "pod", "web-1"]);
    wait_for(Duration::from_secs(60), "web-1 back, ready", || {
        let s = kubectl_fails(
            &lab,
            &["get", "pod", "web-1", "-o", "jsonpath={.status.conditions[?(@.type==\"Ready\")].status}"],
        );
        if s == "True" {
            Ok(())
        } else {
            Err(s)
        }
    });
    assert_eq!((revision_of("web-0"), revision_of("web-1")), (second.clone(), second.clone()), "below the partition");
    lab.kubectl(&[
        "patch",
        "statefulset",
        "web",
        "-p",
        r#"{"spec":{"updateStrategy":{"rollingUpdate":{"partition":0}}}}"#,
    ]);
    wait_for(Duration::from_secs(120), "every pod on the staged revision", || {
        let revs: Vec<Option<String>> = (0..3).map(|i| revision_now(&format!("web-{i}"))).collect();
        if revs.iter().all(|r| r.as_deref() == Some(third.as_str())) {
            Ok(())
        } else {
            Err(format!("{revs:?}"))
        }
    });
    // The pages stayed on their volumes through all of it.
    wait_for(Duration::from_secs(30), "the pages after the updates", || {
        let p = pages();
        if p == ["web-0", "web-1"] {
            Ok(())
        } else {
            Err(format!("{p:?}"))
        }
    });
    // Cleaning up as the tutorial does: the set and the Service, then the claims, whose
    // volumes (reclaimPolicy Delete) go with their directories on the nodes.
    let dir = lab.kubectl(&["get", "pv", "-o", "jsonpath={.items[0].spec.hostPath.path}"]);
    assert!(std::path::Path::new(&dir).is_dir(), "{dir}");
    lab.kubectl(&["delete", "sts", "web"]);
    lab.kubectl(&["delete", "svc", "nginx"]);
    lab.kubectl(&["delete", "pvc", "-l", "app=nginx", "--wait=false"]);
    wait_for(Duration::from_secs(60), "the claims' volumes deleted", || {
        let left = lab.kubectl(&["get", "pv", "-o", "name"]);
        if left.trim().is_empty() {
            Ok(())
        } else {
            Err(left)
        }
    });
    assert!(!std::path::Path::new(&dir).exists(), "{dir} deleted by its node");
}

#[test]
fn workloads_that_cannot_run_say_why_in_the_real_words_and_leave_nothing_after_delete() {
    let (_reg, lab) = lab_with_registry("imgbad", "2");
    // A StatefulSet whose pods fit no node: web-0 Pending with the scheduler's message, and
    // (OrderedReady) no web-1.
    lab.apply(
        "apiVersion: apps/v1\nkind: StatefulSet\nmetadata: {name: stuck}\nspec:\n  serviceName: stuck\n  replicas: 2\n  selector: {matchLabels: {app: stuck}}\n  template:\n    metadata: {labels: {app: stuck}}\n    spec:\n      nodeSelector: {disk: none}\n      containers: [{name: c, image: busybox, command: [sleep, '3600']}]\n",
    );
    let message = wait_for(Duration::from_secs(30), "stuck-0 unschedulable", || {
        let m = kubectl_fails(
            &lab,
            &["get", "pod", "stuck-0", "-o", "jsonpath={.status.conditions[?(@.type==\"PodScheduled\")].message}"],
        );
        if m.starts_with("0/2 nodes") {
            Ok(m)
        } else {
            Err(m)
        }
    });
    assert_eq!(
        message,
        "0/2 nodes are available: 2 node(s) didn't match Pod's node affinity/selector. preemption: 0/2 nodes are available: 2 Preemption is not helpful for scheduling."
    );
    let events = lab.kubectl(&[
        "get",
        "events",
        "--field-selector",
        "involvedObject.name=stuck-0",
        "-o",
        "custom-columns=R:.reason",
        "--no-headers",
    ]);
    assert!(events.contains("FailedScheduling"), "{events}");
    std::thread::sleep(Duration::from_secs(1));
    let pods = lab.kubectl(&["get", "pods", "-l", "app=stuck", "-o", "name"]);
    assert_eq!(pods.trim(), "pod/stuck-0", "web-1 waits for web-0");
    let row = lab.kubectl(&["get", "sts", "stuck", "--no-headers"]);
    assert_eq!(row.split_whitespace().nth(1), Some("0/2"), "{row}");
    // A DaemonSet whose pods crash: each in CrashLoopBackOff with kubelet's Event, none ready.
    lab.apply(
        "apiVersion: apps/v1\nkind: DaemonSet\nmetadata: {name: crashy}\nspec:\n  selector: {matchLabels: {app: crashy}}\n  template:\n    metadata: {labels: {app: crashy}}\n    spec:\n      containers: [{name: c, image: busybox, command: [sh, -c, 'echo bad config; exit 1']}]\n",
    );
    wait_for(Duration::from_secs(60), "both daemon pods crash looping", || {
        let reasons = lab.kubectl(&[
            "get",
            "pods",
            "-l",
            "app=crashy",
            "-o",
            "jsonpath={range .items[*]}{.status.containerStatuses[0].state.waiting.reason} {end}",
        ]);
        if reasons.split_whitespace().filter(|r| *r == "CrashLoopBackOff").count() == 2 {
            Ok(())
        } else {
            Err(reasons)
        }
    });
    let status = lab.kubectl(&[
        "get",
        "ds",
        "crashy",
        "-o",
        "jsonpath={.status.desiredNumberScheduled} {.status.numberReady} {.status.numberUnavailable}",
    ]);
    assert_eq!(status, "2 0 2");
    let pod = lab.kubectl(&["get", "pods", "-l", "app=crashy", "-o", "jsonpath={.items[0].metadata.name}"]);
    let described = lab.kubectl(&["describe", "pod", &pod]);
    assert!(described.contains("Back-off restarting failed container c in pod"), "{described}");
    assert!(lab.kubectl(&["logs", &pod]).contains("bad config"));
    // Deleted, nothing of them is left.
    lab.kubectl(&["delete", "sts", "stuck"]);
    lab.kubectl(&["delete", "ds", "crashy"]);
    wait_for(Duration::from_secs(60), "their pods gone", || {
        let left = lab.kubectl(&["get", "pods", "-l", "app in (stuck,crashy)", "-o", "name"]);
        let revisions = lab.kubectl(&["get", "controllerrevisions", "-o", "name"]);
        if left.trim().is_empty() && revisions.trim().is_empty() {
            Ok(())
        } else {
            Err(format!("{left}{revisions}"))
        }
    });
}

/// `kubectl debug -i POD --image=busybox --target=CONTAINER`: an ephemeral container joins the
/// running pod — its network (the pod's localhost answers), its hostname, and with `--target`
/// the target container's PID namespace (the nginx processes are listed) — runs once, is
/// reported in `ephemeralContainerStatuses` and logged; the pod's own container is untouched
/// (no restart, still Ready). Bad requests get the real texts.
#[test]
fn kubectl_debug_brings_a_tool_into_a_running_pod() {
    let (reg, lab) = lab_with_registry("debug", "1");
    reg.push("library/nginx:latest", &nginx(), None);
    lab.kubectl(&["run", "web", "--image=nginx"]);
    lab.kubectl(&["wait", "--for=condition=Ready", "pod/web", "--timeout=90s"]);
    let script = "hostname; wget -qO- http://127.0.0.1/ | head -c 200; echo; ps -o comm,args";
    let o = wait_bounded(
        std::process::Command::new("kubectl")
            .arg("--kubeconfig")
            .arg(&lab.kubeconfig)
            .args([
                "debug",
                "-i",
                "web",
                "--image=busybox",
                "--target=web",
                "--container=dbg",
                "--",
                "sh",
                "-c",
                script,
            ])
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap(),
        Duration::from_secs(90),
    );
    let (out, err) = text(&o);
    assert!(o.status.success(), "{out}{err}");
    assert!(out.starts_with("Targeting container \"web\"."), "{out}");
    let state = wait_for(Duration::from_secs(30), "the ephemeral container's status", || {
        let s = lab.kubectl(&["get", "pod", "web", "-o", "jsonpath={.status.ephemeralContainerStatuses[0].name} {.status.ephemeralContainerStatuses[0].state.terminated.reason}"]);
        if s == "dbg Completed" {
            Ok(s)
        } else {
            Err(s)
        }
    });
    assert_eq!(state, "dbg Completed");
    // What it printed (the attach may join after the first lines; the log has them all).
    let logs = lab.kubectl(&["logs", "web", "-c", "dbg"]);
    assert!(logs.starts_with("web\n"), "the pod's hostname: {logs}");
    assert!(logs.contains("<title>Welcome to nginx!</title>"), "the pod's localhost answers: {logs}");
    assert!(logs.contains("nginx: master process nginx -g daemon off;"), "the target's processes (--target): {logs}");
    let main = lab.kubectl(&[
        "get",
        "pod",
        "web",
        "-o",
        "jsonpath={.status.containerStatuses[0].restartCount} {.status.conditions[?(@.type==\"Ready\")].status}",
    ]);
    assert_eq!(main, "0 True");
    // The same name again, a missing target, a change of an existing one: refused.
    let err = kubectl_fails(&lab, &["patch", "pod", "web", "--subresource=ephemeralcontainers", "--type=json",
        "-p", "[{\"op\": \"add\", \"path\": \"/spec/ephemeralContainers/-\", \"value\": {\"name\": \"dbg\", \"image\": \"busybox\"}}]"]);
    assert!(err.contains("spec.ephemeralContainers[1].name: Duplicate value: \"dbg\""), "{err}");
    let err = kubectl_fails(&lab, &["debug", "web", "--image=busybox", "--target=nope", "--container=x", "--", "true"]);
    assert!(err.contains("spec.ephemeralContainers[1].targetContainerName: Not found: \"nope\""), "{err}");
    let err = kubectl_fails(
        &lab,
        &[
            "patch",
            "pod",
            "web",
            "--subresource=ephemeralcontainers",
            "--type=json",
            "-p",
            "[{\"op\": \"remove\", \"path\": \"/spec/ephemeralContainers/0\"}]",
        ],
    );
    assert!(err.contains("existing ephemeral containers \"dbg\" may not be removed"), "{err}");
}
