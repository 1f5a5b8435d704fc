/* Prints the region layout as JSON so the Python reader can be checked against the C one. */
#include "region.h"

#include <stddef.h>
#include <stdio.h>

#define F(type, field) printf("  \"%s.%s\": %zu,\n", #type, #field, offsetof(struct type, field))

int main(void) {
    printf("{\n");
    printf("  \"magic\": %llu,\n  \"version\": %u,\n", (unsigned long long)RG_MAGIC, RG_VERSION);
    printf("  \"total_size\": %u,\n  \"tenants_off\": %u,\n  \"slots_off\": %u,\n", (unsigned)RG_TOTAL_SIZE,
           (unsigned)RG_TENANTS_OFF, (unsigned)RG_SLOTS_OFF);
    printf("  \"tenant_size\": %u,\n  \"slot_size\": %u,\n", RG_TENANT_SIZE, RG_SLOT_SIZE);
    printf("  \"max_tenants\": %d,\n  \"max_slots\": %d,\n", RG_MAX_TENANTS, RG_MAX_SLOTS);
    F(rg_header, gpu_uuid);
    F(rg_header, lease);
    F(rg_header, lease_deadline_ns);
    F(rg_header, nwaiting);
    F(rg_header, transitions);
    F(rg_header, ctx_bytes);
    F(rg_header, ctx_driver);
    F(rg_header, ctx_measured);
    F(rg_header, ctx_max);
    F(rg_header, cuda_total);
    F(rg_header, ctx_unmeasured);
    F(rg_header, ctx_lock_byte);
    F(rg_tenant, state);
    F(rg_tenant, name);
    F(rg_tenant, mem_limit);
    F(rg_tenant, share_permille);
    F(rg_tenant, policy);
    F(rg_tenant, klass);
    F(rg_tenant, waiting);
    F(rg_tenant, busy_ns);
    F(rg_tenant, charged_ns);
    F(rg_tenant, config_gen);
    F(rg_tenant, mem_capped);
    F(rg_tenant, grants);
    F(rg_tenant, members);
    F(rg_slot, state);
    F(rg_slot, pid);
    F(rg_slot, tenant);
    F(rg_slot, starttime);
    F(rg_slot, pidns);
    F(rg_slot, mem_used);
    F(rg_slot, busy_ns);
    F(rg_slot, launches);
    F(rg_slot, mem_limit);
    F(rg_slot, init_ns);
    F(rg_slot, init_cpu_ns);
    F(rg_slot, waited_ns);
    F(rg_slot, init_lock_wait_us);
    printf("  \"end\": 0\n}\n");
    return 0;
}
