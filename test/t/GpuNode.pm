# A cluster whose service runs a GPU process, for the TAP tests of the GPU
# path: the GPU where GPU_IVFPQ_EXPECT_GPU=1 (the GPU machine's runs), else
# the service's CPU emulation, which speaks the same protocol.
package GpuNode;

use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use Test::More;

# A started node named $name, with gpu_ivfpq preloaded, the extension
# created in database postgres and its GPU process serving (else the test
# bails out); $conf: more postgresql.conf lines.
sub start
{
	my ($name, $conf) = @_;
	my $emulate = $ENV{GPU_IVFPQ_EXPECT_GPU} ? 'off' : 'on';
	my $node = PostgreSQL::Test::Cluster->new($name);

	$node->init;
	$node->append_conf('postgresql.conf',
		"shared_preload_libraries = 'gpu_ivfpq'\ngpu_ivfpq.service_emulate_gpu = $emulate\n" . ($conf // ''));
	$node->start;
	$node->safe_psql('postgres', 'CREATE EXTENSION gpu_ivfpq');
	ok($node->poll_query_until('postgres', q{SELECT state LIKE 'running (GPU%' FROM gpu_ivfpq_status}),
		'the GPU serves') or BAIL_OUT('no GPU service');
	return $node;
}

1;
