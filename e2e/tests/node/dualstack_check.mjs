// @kubernetes/client-node against a dual-stack apiserver-lite (two Service ranges): a
// RequireDualStack Service IPv6-first gets a ClusterIP of each family, a downgrade releases
// the second, and a single-stack policy with two families is refused with kube-apiserver's words.
// Usage: node dualstack_check.mjs KUBECONFIG. Prints one line per step; exits non-zero on failure.
import * as k8s from '@kubernetes/client-node';
import { isIPv4, isIPv6 } from 'node:net';

const step = (msg) => console.log(msg);
const kc = new k8s.KubeConfig();
kc.loadFromFile(process.argv[2]);
const core = kc.makeApiClient(k8s.CoreV1Api);

const svc = await core.createNamespacedService({
  namespace: 'default',
  body: { metadata: { name: 'js-dual' },
          spec: { ipFamilyPolicy: 'RequireDualStack', ipFamilies: ['IPv6', 'IPv4'], selector: { app: 'js' },
                  ports: [{ port: 80, targetPort: 8080 }] } },
});
const ips = svc.spec.clusterIPs;
if (!(ips.length === 2 && isIPv6(ips[0]) && isIPv4(ips[1]))) throw new Error(`clusterIPs ${JSON.stringify(ips)}`);
if (svc.spec.clusterIP !== ips[0]) throw new Error(`clusterIP ${svc.spec.clusterIP}`);
if (JSON.stringify(svc.spec.ipFamilies) !== '["IPv6","IPv4"]') throw new Error(`ipFamilies ${svc.spec.ipFamilies}`);
step(`clusterIPs ${ips.join(' ')}`);

const got = await core.readNamespacedService({ name: 'js-dual', namespace: 'default' });
if (JSON.stringify(got.spec.clusterIPs) !== JSON.stringify(ips)) throw new Error(`read ${got.spec.clusterIPs}`);

const down = await core.patchNamespacedService(
  { name: 'js-dual', namespace: 'default', body: { spec: { ipFamilyPolicy: 'SingleStack' } } },
  k8s.setHeaderOptions('Content-Type', k8s.PatchStrategy.MergePatch));
if (JSON.stringify(down.spec.clusterIPs) !== JSON.stringify([ips[0]])) throw new Error(`downgraded ${down.spec.clusterIPs}`);
if (JSON.stringify(down.spec.ipFamilies) !== '["IPv6"]') throw new Error(`downgraded families ${down.spec.ipFamilies}`);
step('downgraded to SingleStack');

try {
  await core.createNamespacedService({
    namespace: 'default',
    body: { metadata: { name: 'js-bad' },
            spec: { ipFamilyPolicy: 'SingleStack', ipFamilies: ['IPv4', 'IPv6'], ports: [{ port: 80 }] } },
  });
  throw new Error('a SingleStack Service with two families was created');
} catch (e) {
  if (e.code !== 422) throw e;
  const message = JSON.parse(e.body).message;
  const want = 'Service "js-bad" is invalid: spec.ipFamilyPolicy: Invalid value: "SingleStack": '
    + "must be 'RequireDualStack' or 'PreferDualStack' when multiple IP families are specified";
  if (message !== want) throw new Error(`message ${message}`);
  step('refused SingleStack with two families');
}
await core.deleteNamespacedService({ name: 'js-dual', namespace: 'default' });
step('node dual-stack: ok');
