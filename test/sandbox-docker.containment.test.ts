/**
 * The shared containment cases (test/containment-cases.ts) against
 * DockerSandbox: all of them on the BusyBox image (its nc is the network
 * probe's client), the command limits on the GNU image too. `network: true`
 * joins the host's network (`dockerNetwork: "host"`): the test daemon creates no bridge.
 */
import { execFileSync } from "node:child_process";
import { randomUUID } from "node:crypto";
import { readFileSync, readdirSync, statSync } from "node:fs";
import { join } from "node:path";
import Docker from "dockerode";
import { describe, expect, it } from "vitest";
import { toSeedProtocol } from "../core/seed.js";
import { DockerSandbox } from "../sandboxes/docker.js";
import { commandCases, containmentCases, type ContainmentLimits } from "./containment-cases.js";
import { TEST_LABELS, dockerService } from "./support/sandbox-services.js";

const { socket, images } = dockerService();

/** Where each sandbox's workspace volume lives on the host, read from the daemon at creation. */
const hostWorkspaces = new WeakMap<object, string>();

const create = (image: string) => async (limits: ContainmentLimits) => {
  const sandbox = await DockerSandbox.create({
    image,
    docker: socket,
    labels: TEST_LABELS,
    network: limits.network,
    dockerNetwork: limits.network ? "host" : undefined,
    memoryMb: limits.memoryMb,
    maxProcesses: limits.maxProcesses,
  });
  const info = await sandbox.container.inspect();
  hostWorkspaces.set(sandbox, info.Mounts.find((mount) => mount.Destination === sandbox.workspace)?.Source ?? "");
  return sandbox;
};
const hostWorkspace = (sandbox: object) => hostWorkspaces.get(sandbox) ?? "";

containmentCases({ name: "docker (busybox)", create: create(images.busybox), hostWorkspace });
commandCases({ name: "docker (gnu)", create: create(images.gnu) });

/**
 * Issue 8's host-escape cases on Docker. The caller's environment is handed
 * to the daemon in the exec's configuration, so only processes inside the
 * container receive it: the LD_PRELOAD probe names a library in the
 * workspace, and no host process outside the container's cgroup may carry
 * it (nor load it). Commands run as 65534, so a setuid copy made inside is
 * never setuid root in the volume on the host.
 */
describe("docker containment: host environment, setuid files, host paths", () => {
  const docker = new Docker({ socketPath: socket });

  /** Host pids whose environment holds `needle`, with whether they sit in the container's cgroup. */
  function hostProcessesWithEnv(needle: string, containerId: string): { pid: number; inContainer: boolean }[] {
    const found: { pid: number; inContainer: boolean }[] = [];
    for (const entry of readdirSync("/proc")) {
      if (!/^\d+$/.test(entry) || Number(entry) === process.pid) continue;
      try {
        if (!readFileSync(`/proc/${entry}/environ`, "latin1").includes(needle)) continue;
        found.push({ pid: Number(entry), inContainer: readFileSync(`/proc/${entry}/cgroup`, "utf8").includes(containerId) });
      } catch {
        // Exited, or not ours to read.
      }
    }
    return found;
  }

  it("the caller's env (an LD_PRELOAD of a workspace library) reaches only processes inside the container", async () => {
    const sandbox = await DockerSandbox.create({ image: images.busybox, docker: socket, labels: TEST_LABELS });
    try {
      const info = await docker.getContainer(sandbox.id).inspect();
      const hostWorkspace = info.Mounts.find((mount) => mount.Destination === sandbox.workspace)!.Source;
      const probe = `strata-probe-${randomUUID()}`;
      // The library path as a host process would need it; loading it anywhere on the host would need this exact value.
      const env = { LD_PRELOAD: `${hostWorkspace}/probe.so`, STRATA_PROBE: probe };
      const running = toSeedProtocol(sandbox).execute("sleep 2", { env });
      await new Promise((resolve) => setTimeout(resolve, 800));
      const carriers = hostProcessesWithEnv(probe, sandbox.id);
      await running;
      expect(carriers.length).toBeGreaterThan(0); // the probe works: the command itself carries it
      expect(carriers.filter((carrier) => !carrier.inContainer)).toEqual([]);
      // Nor is it in the container's own configuration (what docker inspect shows every host user with access to the daemon).
      expect(JSON.stringify((await docker.getContainer(sandbox.id).inspect()).Config.Env)).not.toContain(probe);
    } finally {
      await sandbox.close();
    }
  });

  it("a setuid copy made inside is not setuid root on the host (commands run as 65534)", async () => {
    for (const image of [images.busybox, images.gnu]) {
      const sandbox = await DockerSandbox.create({ image, docker: socket, labels: TEST_LABELS });
      try {
        const made = await toSeedProtocol(sandbox).execute("cp /bin/busybox ./t 2>/dev/null || cp /usr/bin/true ./t; chmod 4755 ./t; chmod 2755 ./t2 2>/dev/null; id -u");
        expect(made.output.trim().split("\n").pop()).toBe("65534");
        const info = await docker.getContainer(sandbox.id).inspect();
        const hostWorkspace = info.Mounts.find((mount) => mount.Destination === sandbox.workspace)!.Source;
        const host = statSync(join(hostWorkspace, "t"));
        expect(host.uid).toBe(65534);
        // No setuid or setgid file owned by root (or group root) anywhere in the volume.
        const privileged = execFileSync("find", [hostWorkspace, "(", "-perm", "-4000", "-uid", "0", ")", "-o", "(", "-perm", "-2000", "-gid", "0", ")"], {
          encoding: "utf8",
        });
        expect(privileged).toBe("");
        expect(host.mode & 0o4000).toBe(0o4000); // the bit is there, for 65534 only: the probe did run
      } finally {
        await sandbox.close();
      }
    }
  });

  it("mountinfo inside: what it shows of the host (documented, not hidden: Docker does not mask it)", async () => {
    const sandbox = await DockerSandbox.create({ image: images.busybox, docker: socket, labels: TEST_LABELS });
    try {
      const info = await docker.getContainer(sandbox.id).inspect();
      const hostWorkspace = info.Mounts.find((mount) => mount.Destination === sandbox.workspace)!.Source;
      const mountinfo = (await toSeedProtocol(sandbox).execute("cat /proc/self/mountinfo")).output;
      // The volume's host path is the mount's root in mountinfo, and the image's layers name the data root too.
      // What keeps that harmless: no host process takes a path or environment from the caller (the case above).
      expect(mountinfo).toContain(hostWorkspace);
      // Our own answers never name it: they name the path the caller gave, in the container.
      const missing = await toSeedProtocol(sandbox).read(`${sandbox.workspace}/nope`);
      expect(missing).toMatch(/^Error: File '\/workspace\/nope' not found/);
      expect(missing).not.toContain(hostWorkspace);
    } finally {
      await sandbox.close();
    }
  });
});
