/**
 * What the runtime's service-backed tests read from the environment (set by
 * scripts/services/*.sh). A missing service fails the test, never skips it,
 * and says which script to run.
 */
export function requireService(variable: string, script: string): string {
  const value = process.env[variable];
  if (value) return value;
  throw new Error(
    `${variable} is not set${process.env.STRATA_SERVICES_REQUIRED === "1" ? " (STRATA_SERVICES_REQUIRED=1)" : ""}: ` +
      `run \`bash scripts/services/${script} && source .services/env\` first (npm test does this for you)`,
  );
}

/** Fails because a provider cannot run here. */
export function providerMissing(provider: string, reason: string | undefined, script: string): never {
  throw new Error(`The ${provider} provider is not available here (${reason ?? "unknown reason"}): run \`bash scripts/services/${script} && source .services/env\` first`);
}
