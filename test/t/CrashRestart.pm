# Waiting for a server through a crash restart, for the TAP tests that kill
# a process. PostgreSQL::Test::Cluster's poll_query_until runs one psql per
# attempt and writes the query to its standard input: while the postmaster
# reinitializes, psql can fail to connect and exit before reading it, and
# the write then dies with EPIPE and ends the whole test. Here each attempt
# is guarded, so a refused connection is only a failed attempt.
package CrashRestart;

use strict;
use warnings;

use Time::HiRes qw(usleep);

# True once $query returns 't' on database postgres (within about 3 minutes).
sub poll_until
{
	my ($node, $query) = @_;

	for (1 .. 900)
	{
		my $result = eval {
			local $SIG{PIPE} = 'IGNORE';
			$node->safe_psql('postgres', $query);
		};
		return 1 if defined $result && $result eq 't';
		usleep(200_000);
	}
	return 0;
}

1;
