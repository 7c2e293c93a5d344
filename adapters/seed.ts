/**
 * The seeds' constructors, for code ported from them: the positional forms
 * the seeds show (`FilesystemBackend(root, virtual_mode)`, `DockerSandbox(image,
 * work_dir)` with `stop()`), answering the seeds' protocol (`toSeedProtocol`).
 * New code uses the classes and the native API.
 */
import { FilesystemBackend } from "../backends/filesystem.js";
import { toSeedProtocol, type BackendProtocol, type SandboxBackendProtocol } from "../core/seed.js";
import { DockerSandbox } from "../sandboxes/docker.js";

/** `FilesystemBackend(root, virtualMode = true)` of the seeds. */
export function seedFilesystemBackend(root: string, virtualMode = true): BackendProtocol {
  return toSeedProtocol(new FilesystemBackend({ workspace: root, virtualMode }));
}

/** `DockerSandbox(image, workDir = "/workspace")` of the seeds: a started container; `stop()` removes it. */
export async function seedDockerSandbox(image: string, workDir = "/workspace"): Promise<SandboxBackendProtocol> {
  return toSeedProtocol(await DockerSandbox.create({ image, workspace: workDir }));
}
