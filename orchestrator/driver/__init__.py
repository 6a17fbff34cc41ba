"""Driver side: what the machine driving a gate does (`gate.run_gate`): archive the head and check its
md5 (`provenance`), place the job on its box through Ray and stream it back (`placement`), then record
the result and render its report once. The CLI gate and the service both go through `placement.place`.
"""
