/**
 * A provider written for the runtime's unit tests (refcount, stream). It is
 * not a stand-in for a real component: it opens real LocalSandboxes, like the
 * built-in "local" provider, and only adds what the tests observe: how many
 * times a sandbox was torn down, and a way to make dispatch throw.
 */
import { LocalSandbox } from "../../sandboxes/local.js";
import { SandboxProviderBase, type Capabilities, type OpenedSandbox, type SandboxHandle } from "../../runtime/index.js";
import type { Payload, ResultOf } from "../../runtime/payloads.js";

export class CountingProvider extends SandboxProviderBase {
  teardowns = 0;
  /** When set, dispatch throws this (as a provider with a bug or a dead connection would). */
  breakWith: Error | undefined;

  constructor(name = "counting") {
    super(name);
  }

  unavailableReason(): string | undefined {
    return undefined;
  }

  capabilities(): Capabilities {
    return { isolation: "process", commands: true, files: true, codeRun: true, streaming: true, coldStart: "not measured" };
  }

  protected async create(): Promise<OpenedSandbox> {
    const sandbox = new LocalSandbox();
    return {
      sandbox,
      teardown: async () => {
        await sandbox.close();
        this.teardowns += 1;
      },
    };
  }

  override async dispatch<P extends Payload>(handle: SandboxHandle, payload: P): Promise<ResultOf<P["type"]>> {
    if (this.breakWith) throw this.breakWith;
    return super.dispatch(handle, payload);
  }
}

export const sleep = (ms: number) => new Promise<void>((resolve) => setTimeout(resolve, ms));
