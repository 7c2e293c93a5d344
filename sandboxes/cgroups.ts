/**
 * Per-sandbox cgroups (v1 pids and memory controllers) for BubblewrapSandbox:
 * created under this process's own cgroups, so limits set above still apply.
 */
import { constants as fsConstants } from "node:fs";
import fs from "node:fs/promises";
import nodePath from "node:path";

/**
 * Creates the sandbox's cgroups and sets the limits. A controller that is
 * missing or not writable is left out; the caller falls back to rlimits for it.
 */
export async function createCgroups(name: string, memoryBytes: number, maxProcesses: number): Promise<{ pids?: string; memory?: string }> {
  const result: { pids?: string; memory?: string } = {};
  const pids = await controllerDir("pids");
  if (pids) {
    const dir = nodePath.join(pids, name);
    if (await tryCreate(dir, [["pids.max", String(maxProcesses)]])) result.pids = dir;
  }
  const memory = await controllerDir("memory");
  if (memory) {
    const dir = nodePath.join(memory, name);
    if (await tryCreate(dir, [["memory.limit_in_bytes", String(memoryBytes)]])) {
      // Without swap limits a bomb would swap instead of being stopped; absent when swap accounting is off.
      await fs.writeFile(nodePath.join(dir, "memory.memsw.limit_in_bytes"), String(memoryBytes)).catch(() => undefined);
      result.memory = dir;
    }
  }
  return result;
}

async function tryCreate(dir: string, settings: [string, string][]): Promise<boolean> {
  try {
    await fs.mkdir(dir);
  } catch (error) {
    if ((error as NodeJS.ErrnoException).code !== "EEXIST") return false;
  }
  try {
    for (const [file, value] of settings) await fs.writeFile(nodePath.join(dir, file), value);
    await fs.access(nodePath.join(dir, "cgroup.procs"), fsConstants.W_OK);
    return true;
  } catch {
    await removeCgroup(dir);
    return false;
  }
}

/** This process's cgroup directory for a v1 controller, from /proc/self/cgroup and /proc/self/mountinfo. */
async function controllerDir(controller: string): Promise<string | undefined> {
  try {
    const membership = (await fs.readFile("/proc/self/cgroup", "utf8"))
      .split("\n")
      .map((line) => line.split(":"))
      .find((fields) => fields.length >= 3 && fields[1]!.split(",").includes(controller));
    if (!membership) return undefined;
    const path = membership.slice(2).join(":");
    for (const line of (await fs.readFile("/proc/self/mountinfo", "utf8")).split("\n")) {
      const [left, right] = line.split(" - ");
      if (!left || !right) continue;
      const [fstype, , superOptions = ""] = right.split(" ");
      if (fstype !== "cgroup" || !superOptions.split(",").includes(controller)) continue;
      const fields = left.split(" ");
      const root = fields[3]!;
      const mountPoint = fields[4]!;
      if (path !== root && !path.startsWith(root === "/" ? "/" : `${root}/`)) continue;
      return nodePath.join(mountPoint, path.slice(root === "/" ? 0 : root.length));
    }
  } catch {
    // No /proc or no cgroups: rlimits it is.
  }
  return undefined;
}

/** How many times the memory cgroup's OOM killer has fired. */
export async function oomKills(memoryDir: string): Promise<number> {
  try {
    const match = /^oom_kill (\d+)$/m.exec(await fs.readFile(nodePath.join(memoryDir, "memory.oom_control"), "utf8"));
    return match ? Number(match[1]) : 0;
  } catch {
    return 0;
  }
}

/** Removes a cgroup; its processes are gone once the PID namespace ended, which can take a moment. */
export async function removeCgroup(dir: string): Promise<void> {
  for (let attempt = 0; attempt < 50; attempt++) {
    try {
      await fs.rmdir(dir);
      return;
    } catch (error) {
      const code = (error as NodeJS.ErrnoException).code;
      if (code === "ENOENT") return;
      if (code !== "EBUSY") return;
      await new Promise((resolve) => setTimeout(resolve, 20));
    }
  }
}
